"""Task callables for the waiting tests (importable by real workers)."""
from __future__ import annotations

import json
import os
import time
from typing import Any

from orchestrator.exceptions import Reschedule


def _append(path: str, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def reschedule_until(path: str, marker: str, seconds: float, context: dict[str, Any]) -> str:
    """Come back in `seconds` until `marker` exists, writing each try it ran as."""
    _append(path, {"task_id": context["task_id"], "try_number": context["try_number"], "at": time.time()})
    if not os.path.exists(marker):
        raise Reschedule(seconds)
    return "landed"


def record(path: str, seconds: float, context: dict[str, Any]) -> None:
    """Hold the slot for `seconds`, writing when it started and ended."""
    start = time.time()
    time.sleep(seconds)
    _append(path, {"task_id": context["task_id"], "start": start, "end": time.time()})


def read(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
