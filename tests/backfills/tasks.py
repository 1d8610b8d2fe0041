"""Task callables for the backfill tests: each records when it ran, for which logical date."""
from __future__ import annotations

import json
import os
import time
from typing import Any


def record(log: str, seconds: float = 0.5, context: dict[str, Any] | None = None) -> None:
    """Append its start and end to `log`; fail if a file `log`.fail-<logical date> exists."""
    context = context or {}
    entry = {"run_id": context.get("run_id"), "logical_date": context.get("logical_date"), "pid": os.getpid()}
    _append(log, {**entry, "start": time.time()})
    time.sleep(seconds)
    _append(log, {**entry, "end": time.time()})
    if os.path.exists(f"{log}.fail-{context.get('logical_date')}"):
        raise RuntimeError(f"told to fail for {context.get('logical_date')}")


def _append(log: str, entry: dict[str, Any]) -> None:
    with open(log, "a") as f:
        f.write(json.dumps(entry) + "\n")  # one small write with O_APPEND: lines never interleave


def intervals(log: str) -> list[tuple[float, float, str]]:
    """(start, end, logical_date) of each finished call, read back from `log`."""
    starts: dict[tuple[str, int], float] = {}
    found = []
    with open(log) as f:
        for line in f:
            entry = json.loads(line)
            key = (entry["run_id"], entry["pid"])
            if "start" in entry:
                starts[key] = entry["start"]
            else:
                found.append((starts.pop(key), entry["end"], entry["logical_date"]))
    return found


def most_at_once(spans: list[tuple[float, float, str]]) -> int:
    """The most calls that were running at the same moment."""
    events = sorted([(start, 1) for start, _, _ in spans] + [(end, -1) for _, end, _ in spans], key=lambda e: (e[0], e[1]))
    current = peak = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak
