"""The retry budget of each task of a DAG spec against the deadlines it must fit.

The arithmetic is `retries.budget`; this module applies it to a validated spec (or to a DAG in
the database, for its page and the admin) with the task's effective arguments.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings

from orchestrator.data.taskconfig import merge_args
from retries.budget import Verdict, check_task, seconds


def verdicts(default_args: Mapping[str, Any] | None, tasks: Iterable[tuple[str, Mapping[str, Any], list]], dag_deadlines: list) -> list[Verdict]:
    """Every task's verdict against every deadline that bounds it; `tasks` is (task_id, its own
    args, its deadlines)."""
    found: list[Verdict] = []
    for task_id, args, task_deadlines in tasks:
        found += check_task(
            task_id,
            merge_args(dict(default_args or {}), dict(args)),
            task_deadlines,
            dag_deadlines,
            infrastructure_retry_delay=float(settings.ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY),
            detection_seconds=float(settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT),
        )
    return found


def spec_verdicts(spec: Mapping[str, Any]) -> list[Verdict]:
    return verdicts(spec["default_args"], [(t["task_id"], t["args"], t["deadlines"]) for t in spec["tasks"]], spec["deadlines"])


def dag_verdicts(dag: Any, tasks: Iterable[tuple[int, str, Mapping[str, Any]]] | None = None) -> list[Verdict]:
    """The same verdicts for a DAG in the database (its page and the admin): of every task, or
    only of `tasks`, (pk, task_id, own args), as the DAG page passes the page of tasks it shows."""
    from deadlines.models import DeadlineDefinition

    rows = DeadlineDefinition.objects.filter(dag=dag).order_by("id").values_list("task_id", "reference", "interval")
    by_task: dict[int | None, list[dict[str, Any]]] = {}
    for task_pk, reference, interval in rows:
        by_task.setdefault(task_pk, []).append({"reference": reference, "interval": interval})
    if not by_task:
        return []  # no deadline, nothing to fit: no task's arguments need reading
    if tasks is None:
        tasks = dag.tasks.order_by("position", "id").values_list("pk", "task_id", "args")
    return verdicts(dag.default_args, [(task_id, args, by_task.get(pk, [])) for pk, task_id, args in tasks], by_task.get(None, []))


def warning_text(verdict: Verdict) -> str:
    """`task 'load': task deadlines[0] (task_started_at + 300 s): worst case 450 s exceeds 300 s ...`"""
    return (
        f"task '{verdict.task_id}': {verdict.deadline}: the retry budget's worst case {seconds(verdict.worst_case)} s"
        f" exceeds the deadline's {seconds(verdict.interval)} s (the platform budget's worst case adds up to"
        f" {seconds(verdict.platform_worst_case)} s more)"
    )
