"""Export DAGs from the database to the spec format, so that importing the export changes nothing."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from zoneinfo import ZoneInfo

import yaml
from django.db.models import Prefetch

from deadlines.models import DeadlineDefinition
from orchestrator.models import Dag, Task
from orchestrator.specs.schema import ARG_KEYS, DAG_DEFAULTS, DEFAULT_ARG_KEYS, LIMIT_KEYS
from retries.states import TriggerRule


class UnknownDag(LookupError):
    """A DAG id asked for that is not in the database."""


def export_yaml(dag_ids: Iterable[str] = ()) -> str:
    """A YAML list of the given DAGs (all DAGs when none are given), in the order asked for."""
    return dump([dag_spec(dag) for dag in select_dags(list(dag_ids))])


def select_dags(dag_ids: list[str]) -> list[Dag]:
    """The DAGs with these ids (all, by dag_id, when empty); raises UnknownDag naming the missing ones."""
    task_deadlines = Prefetch(
        "tasks__deadline_definitions", queryset=DeadlineDefinition.objects.order_by("position", "id")
    )
    dag_deadlines = Prefetch("deadline_definitions", queryset=DeadlineDefinition.objects.order_by("position", "id"))
    queryset = Dag.objects.prefetch_related(
        Prefetch("tasks", queryset=Task.objects.order_by("position", "id")), task_deadlines, dag_deadlines
    )
    if not dag_ids:
        return list(queryset.order_by("dag_id"))
    found = {dag.dag_id: dag for dag in queryset.filter(dag_id__in=dag_ids)}
    missing = [dag_id for dag_id in dag_ids if dag_id not in found]
    if missing:
        raise UnknownDag(", ".join(repr(dag_id) for dag_id in missing))
    return [found[dag_id] for dag_id in dict.fromkeys(dag_ids)]


def dag_spec(dag: Dag) -> dict[str, Any]:
    """One DAG as a spec mapping; keys left at their defaults are left out."""
    spec: dict[str, Any] = {"dag_id": dag.dag_id}
    if dag.description:
        spec["description"] = dag.description
    spec["schedule"] = dag.schedule or None
    if dag.timezone != DAG_DEFAULTS["timezone"]:
        spec["timezone"] = dag.timezone
    if dag.start_date is not None:
        # Written in the DAG's timezone with its offset: readable, and exact across DST changes.
        spec["start_date"] = dag.start_date.astimezone(ZoneInfo(dag.timezone)).isoformat()
    spec["catchup"] = dag.catchup
    spec["paused"] = dag.paused
    spec["max_active_runs"] = dag.max_active_runs
    if dag.owner:
        spec["owner"] = dag.owner
    if dag.max_active_tasks is not None:
        spec["max_active_tasks"] = dag.max_active_tasks
    if dag.params:
        spec["params"] = _sorted(dag.params)
    if dag.strict_params:
        spec["strict_params"] = True
    if dag.default_args:
        spec["default_args"] = {key: dag.default_args[key] for key in DEFAULT_ARG_KEYS if key in dag.default_args}
    # The DAG's own deadlines; a task's are written with the task.
    deadlines = [deadline_spec(row) for row in dag.deadline_definitions.all() if row.task_id is None]
    if deadlines:
        spec["deadlines"] = deadlines
    spec["tasks"] = [task_spec(task, dag.default_args) for task in dag.tasks.all()]
    return spec


def task_spec(task: Task, dag_default_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """One task as a spec entry. Its trigger_rule is written when it differs from what the task
    would take without one (the DAG's default_args trigger_rule, else all_success)."""
    spec: dict[str, Any] = {"task_id": task.task_id}
    if task.python_callable:
        spec["python_callable"] = task.python_callable
    if task.bash_command:
        spec["bash_command"] = task.bash_command
    if task.wait_for:
        spec["wait_for"] = _sorted(task.wait_for)
    if task.op_kwargs:
        spec["op_kwargs"] = _sorted(task.op_kwargs)
    if task.upstream:
        spec["upstream"] = list(task.upstream)
    if task.trigger_rule != (dag_default_args or {}).get("trigger_rule", TriggerRule.ALL_SUCCESS):
        spec["trigger_rule"] = task.trigger_rule
    if task.expand:
        spec["expand"] = dict(task.expand)
    deadlines = [deadline_spec(row) for row in task.deadline_definitions.all()]
    if deadlines:
        spec["deadlines"] = deadlines
    spec.update(_args(task.args))
    spec.update({key: task.args[key] for key in LIMIT_KEYS if key in (task.args or {})})
    return spec


def deadline_spec(row: DeadlineDefinition) -> dict[str, Any]:
    spec: dict[str, Any] = {"reference": row.reference, "interval": _number(row.interval)}
    if row.datetime_text:
        spec["datetime"] = row.datetime_text
    spec["callback"] = row.callback
    if row.callback_kwargs:
        spec["callback_kwargs"] = _sorted(row.callback_kwargs)
    if row.warn:
        spec["warn"] = True
    if row.days:
        spec["days"] = list(row.days)
    if row.skip_dates:
        spec["skip_dates"] = list(row.skip_dates)
    return spec


def dump(specs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump(specs, sort_keys=False, allow_unicode=True, default_flow_style=False, width=120)


def _args(args: dict[str, Any]) -> dict[str, Any]:
    """default_args keys in one fixed order (JSON columns do not keep the order written)."""
    return {key: args[key] for key in ARG_KEYS if key in args}


def _sorted(value: Any) -> Any:
    """Mappings with sorted keys, all the way down, so every export of the same data is identical."""
    if isinstance(value, dict):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value
