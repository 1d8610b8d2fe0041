"""Memory a long-lived process freed, given back to the system.

glibc's malloc keeps the memory a process frees for its next allocations: a worker or a
scheduler that went through a burst of work and then waits would hold it for nothing (some
1-2 MiB each after start-up alone). `trim()` asks glibc to give it back (`malloc_trim`), a
millisecond or so; where the C library has no such call (musl, macOS) it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import time
from typing import Any


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def trim() -> bool:
    """Give back what malloc holds free; whether this C library could be asked."""
    malloc_trim = _malloc_trim()
    if malloc_trim is None:
        return False
    malloc_trim(0)
    return True


class IdleTrim:
    """Trims once a process has been seen idle for `after` seconds on end (`seen`), and not
    again until it has worked in between: a busy process never pays for it."""

    def __init__(self, after: float) -> None:
        self.after = after
        self._idle_since: float | None = None
        self._trimmed = False

    def seen(self, idle: bool) -> bool:
        """Note whether the process is idle now; True when this call trimmed."""
        now = time.monotonic()
        if not idle:
            self._idle_since, self._trimmed = None, False
            return False
        if self._idle_since is None:
            self._idle_since = now
        if self._trimmed or now - self._idle_since < self.after:
            return False
        self._trimmed = True
        return trim()
