"""How often a DAG (or one of its tasks) met its deadlines over its last N runs, and by how much.

`summarize` is the pure rule; `history` feeds it the rows of the DAG's newest runs.
Lateness is in seconds: positive = late, negative = met early by that much.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from deadlines.models import Deadline
from orchestrator.models import Dag, DagRun

DEFAULT_LAST = 20
MAX_LAST = 1000
RECENT_LIMIT = 50


def summarize(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts by state, the hit rate (met / settled; None when nothing settled yet) and lateness figures."""
    rows = list(rows)
    counts = {state.value: 0 for state in Deadline.State}
    for row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    settled = counts["met"] + counts["missed"]
    lateness = [float(r["lateness_seconds"]) for r in rows if r["state"] in ("met", "missed") and r["lateness_seconds"] is not None]
    missed_lateness = [float(r["lateness_seconds"]) for r in rows if r["state"] == "missed" and r["lateness_seconds"] is not None]
    return {
        "total": len(rows),
        **counts,
        "warned": sum(1 for r in rows if r.get("warned_at")),
        "hit_rate": round(counts["met"] / settled, 4) if settled else None,
        "median_lateness_seconds": _round(statistics.median(lateness)) if lateness else None,
        "mean_lateness_missed_seconds": _round(statistics.fmean(missed_lateness)) if missed_lateness else None,
        "max_lateness_seconds": _round(max(lateness)) if lateness else None,
    }


def history(dag: Dag, task_id: str | None = None, last: int = DEFAULT_LAST) -> dict[str, Any]:
    """The deadline record of `dag`'s newest `last` runs: DAG-level deadlines (with a per-task
    breakdown of task deadlines), or one task's deadlines when `task_id` is given."""
    last = max(1, min(int(last), MAX_LAST))
    run_ids = list(DagRun.objects.filter(dag=dag).order_by("-queued_at", "-id").values_list("pk", flat=True)[:last])
    rows = Deadline.objects.filter(dag_run_id__in=run_ids)
    fields = ("dag_run__run_id", "dag_run__logical_date", "scope", "task_id", "reference", "need_by", "state",
              "lateness_seconds", "resolved_at", "warned_at", "callback_state")
    all_rows = list(rows.order_by("-dag_run__queued_at", "-dag_run_id", "need_by", "id").values(*fields))
    if task_id:
        selected = [r for r in all_rows if r["scope"] == "task" and r["task_id"] == task_id]
    else:
        selected = [r for r in all_rows if r["scope"] == "dag"]
    result: dict[str, Any] = {
        "dag_id": dag.dag_id,
        "task_id": task_id or None,
        "last": last,
        "runs": len(run_ids),
        "summary": summarize(selected),
        "recent": [_recent(r) for r in selected[:RECENT_LIMIT]],
    }
    if not task_id:
        by_task: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for r in all_rows:
            if r["scope"] == "task":
                by_task[r["task_id"]].append(r)
        result["tasks"] = {name: summarize(task_rows) for name, task_rows in sorted(by_task.items())}
    return result


def _recent(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "run_id": row["dag_run__run_id"],
        "logical_date": _iso(row["dag_run__logical_date"]),
        "task_id": row["task_id"],
        "reference": row["reference"],
        "need_by": _iso(row["need_by"]),
        "state": row["state"],
        "lateness_seconds": _round(row["lateness_seconds"]),
        "warned": row["warned_at"] is not None,
        "callback_state": row["callback_state"],
    }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _round(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None


def dag_deadline_history(dag: Dag, last: int = DEFAULT_LAST) -> list[dict[str, Any]]:
    """Rows for the DAG page: the DAG's own deadlines, then each task's, with met, missed and
    hit_rate (0..1, or None before anything settled). Empty when no deadline ever existed."""
    record = history(dag, last=last)
    rows: list[dict[str, Any]] = []
    if record["summary"]["total"]:
        rows.append(_page_row("DAG", None, record["summary"]))
    for task_id, summary in record["tasks"].items():
        rows.append(_page_row(f"task {task_id}", task_id, summary))
    return rows


def _page_row(label: str, task_id: str | None, summary: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "label": label,
        "task_id": task_id,
        "met": summary["met"],
        "missed": summary["missed"],
        "hit_rate": summary["hit_rate"],
        "median_lateness_seconds": summary["median_lateness_seconds"],
        "max_lateness_seconds": summary["max_lateness_seconds"],
    }
