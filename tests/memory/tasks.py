"""Tasks for the memory limit tests: they allocate (and touch) memory, then hold it."""
from __future__ import annotations

import time


def allocate(mib: int, hold: float = 30.0) -> int:
    """Take `mib` MiB of memory that is really used (every page written), then hold it."""
    block = bytearray(mib << 20)  # zero-filled: every page touched
    time.sleep(hold)
    return len(block) >> 20


def allocate_by_try(sizes: list[int], context: dict) -> int:
    """Take sizes[try_number - 1] MiB and return at once: a task that needs more on later tries."""
    size = sizes[min(context["try_number"], len(sizes)) - 1]
    block = bytearray(size << 20)
    return len(block) >> 20


def sleep(seconds: float = 60.0) -> None:
    time.sleep(seconds)
