"""Small server-side SVG charts: geometry computed here, drawn by templates/web/_charts.html."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from deadlines.models import Deadline
from orchestrator.console.text import duration
from orchestrator.models import DagRun

WIDTH = 600
HEIGHT = 80
GAP = 2


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    css: str
    title: str
    url: str = ""


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    bars: list[Bar]
    baseline: float
    label: str  # what the chart shows, for screen readers

    @property
    def empty(self) -> bool:
        return not self.bars


def bars(values: Sequence[tuple[float, str, str, str]], label: str, *, baseline_share: float = 1.0) -> Chart:
    """A bar per (value, css class, title, url), scaled to the largest value; equal widths."""
    if not values:
        return Chart(WIDTH, HEIGHT, [], HEIGHT, label)
    top = max(abs(v) for v, *_ in values) or 1.0
    slot = WIDTH / len(values)
    base = HEIGHT * baseline_share
    out = []
    for i, (value, css, title, url) in enumerate(values):
        h = max(2.0, (base - 4) * abs(value) / top) if value else 2.0
        out.append(Bar(round(i * slot + GAP / 2, 1), round(base - h, 1), round(max(slot - GAP, 1), 1), round(h, 1), css, title, url))
    return Chart(WIDTH, HEIGHT, out, base, label)


def deadline_history(runs: Sequence[DagRun]) -> Chart:
    """The DAG-level deadline of each run (oldest first): met in green, missed in red, bar = how late.

    A met deadline is drawn as a short green bar; a missed one as tall as it was late,
    relative to the latest miss. One query for all the runs.
    """
    by_run: dict[int, Deadline] = {}
    for deadline in Deadline.objects.filter(dag_run__in=[r.pk for r in runs], scope="dag").order_by("need_by", "id"):
        by_run.setdefault(deadline.dag_run_id, deadline)
    values: list[tuple[float, str, str, str]] = []
    for run in runs:
        deadline = by_run.get(run.pk)
        if deadline is None:
            continue
        late = deadline.lateness_seconds or 0.0
        if deadline.state == Deadline.State.MISSED:
            values.append((max(late, 1.0), "missed", f"{run.run_id}: missed by {duration(late)}", ""))
        elif deadline.state == Deadline.State.MET:
            values.append((0.0, "met", f"{run.run_id}: met, {duration(-late)} early" if late < 0 else f"{run.run_id}: met", ""))
        else:
            values.append((0.0, "pending", f"{run.run_id}: {deadline.state}", ""))
    return bars(values, "Deadline per run, oldest first: green met, red missed (height: how late)")


def over_time(buckets: Sequence[tuple[datetime, int]], label: str, fmt: str) -> Chart:
    return bars([(n, "failures", f"{at.strftime(fmt)}: {n}", "") for at, n in buckets], label)
