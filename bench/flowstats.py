"""The figures of the three-step benchmark, as its harness defines them (pure functions)."""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


def p95(values: Sequence[float]) -> float:
    """Nearest-rank 95th percentile: of 100 values, the 95th smallest."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def end_to_end(seconds: Sequence[float], steps: int = 3) -> dict[str, Any]:
    """Median and p95 of flows' end-to-end times (seconds in, milliseconds out), and the overhead
    per step: the median end to end divided by the number of steps (the steps do nothing)."""
    if not seconds:
        return {"n": 0, "median_ms": None, "p95_ms": None, "max_ms": None, "per_step_ms": None}
    median = statistics.median(seconds) * 1000
    return {"n": len(seconds), "median_ms": round(median, 2), "p95_ms": round(p95(seconds) * 1000, 2),
            "max_ms": round(max(seconds) * 1000, 2), "per_step_ms": round(median / steps, 2)}


def flows_per_second(count: int, first_sent: float, ends: Sequence[float]) -> float | None:
    """`count` flows started at once: count / (the last flow's end - the first trigger sent)."""
    if not ends or len(ends) < count or max(ends) <= first_sent:
        return None
    return count / (max(ends) - first_sent)
