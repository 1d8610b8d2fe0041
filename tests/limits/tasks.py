"""Task callables for the limit and circuit tests (importable by real workers)."""
from __future__ import annotations

import json
import os
import time
import urllib.request
from typing import Any


def _append(path: str, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def record(path: str, seconds: float, context: dict[str, Any]) -> None:
    """Hold the slot for `seconds`, writing when the task itself started and ended."""
    start = time.time()
    time.sleep(seconds)
    _append(path, {"dag_id": context["dag_id"], "task_id": context["task_id"], "run_id": context["run_id"], "start": start, "end": time.time()})


def call(url: str, context: dict[str, Any]) -> str:
    """Call the downstream; an HTTP error raises, which is an application failure."""
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def read_intervals(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def max_overlap(intervals: list[dict[str, Any]]) -> int:
    """The most intervals open at one instant."""
    events = sorted([(r["start"], 1) for r in intervals] + [(r["end"], -1) for r in intervals], key=lambda e: (e[0], e[1]))
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak
