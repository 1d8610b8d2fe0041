"""Import DAG spec files into the database: validate everything first, then write in one transaction."""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from django.db import transaction
from django.db.models import Model
from django.utils import timezone

from deadlines.models import DeadlineDefinition, Reference
from orchestrator.models import Circuit, Dag, Task
from orchestrator.specs.budget import spec_verdicts, warning_text
from orchestrator.specs.checks import parse_datetime
from orchestrator.specs.errors import SpecError, dag_label, located
from orchestrator.specs.files import FileError, read_spec_file, spec_paths
from orchestrator.specs.pools import known_pools, spec_pool_problems
from orchestrator.specs.schema import DagSpec, validate_dag

# A change to any of these moves the DAG's next scheduled run: the scheduler recomputes it.
SCHEDULE_FIELDS = frozenset({"schedule", "start_date", "timezone"})
JSON_FIELDS = frozenset({"default_args", "op_kwargs", "upstream", "expand", "args", "callback_kwargs", "days", "skip_dates"})
DEADLINE_FIELDS = (
    "reference",
    "interval",
    "datetime",
    "datetime_text",
    "callback",
    "callback_kwargs",
    "warn",
    "days",
    "skip_dates",
)


@dataclass
class ImportResult:
    """Which DAGs an import created, changed, or found already as written."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    # `warning: FILE: dag 'ID': task ...`: retry budgets that can outlast a deadline.
    warnings: list[str] = field(default_factory=list)


def load_specs(paths: Iterable[str | Path], warnings: list[str] | None = None) -> list[DagSpec]:
    """Read and validate every DAG in `paths`; raise SpecError listing every problem found.

    Retry budgets that can outlast a deadline are added to `warnings`, not problems."""
    messages: list[str] = []
    specs: list[DagSpec] = []
    seen: dict[str, str] = {}
    pools = known_pools()
    for path in paths:
        try:
            files = spec_paths(Path(path))
        except FileError as exc:
            messages.append(str(exc))
            continue
        for file in files:
            try:
                raw_dags = read_spec_file(file)
            except FileError as exc:
                messages.append(str(exc))
                continue
            for raw in raw_dags:
                dag_id = raw.data.get("dag_id") if isinstance(raw.data, dict) else None
                label = dag_label(dag_id, raw.index)
                spec, problems = validate_dag(raw.data)
                if not problems:
                    problems = spec_pool_problems(spec, pools)
                messages.extend(located(raw.source, label, problem) for problem in problems)
                if isinstance(dag_id, str) and dag_id in seen:
                    messages.append(located(raw.source, label, f"dag_id: {dag_id!r} is also defined in {seen[dag_id]}"))
                elif isinstance(dag_id, str):
                    seen[dag_id] = raw.source
                if not problems:
                    specs.append(spec)
                    if warnings is not None:
                        warnings += ["warning: " + located(raw.source, label, warning_text(v)) for v in spec_verdicts(spec) if not v.fits]
    if messages:
        raise SpecError(messages)
    return specs


def import_paths(paths: Iterable[str | Path], *, strict: bool = False) -> ImportResult:
    """Import every DAG in `paths`, all or nothing. `strict`: a retry budget that can outlast a
    deadline is an error like any other."""
    warnings: list[str] = []
    specs = load_specs(paths, warnings)
    if strict and warnings:
        raise SpecError([w.removeprefix("warning: ") for w in warnings])
    result = ImportResult(warnings=warnings)
    with transaction.atomic():
        for spec in specs:
            outcome = write_dag(spec)
            getattr(result, outcome).append(spec["dag_id"])
    return result


def write_dag(spec: DagSpec) -> str:
    """Create or update one DAG from a validated spec: "created", "updated" or "unchanged".

    Tasks are matched by task_id; tasks missing from the spec are deleted (their task
    instances keep their history, with `definition` set to null).
    """
    dag = Dag.objects.select_for_update().filter(dag_id=spec["dag_id"]).first()
    created = dag is None
    if dag is None:
        dag = Dag(dag_id=spec["dag_id"])
    values: dict[str, Any] = {
        "description": spec["description"],
        "schedule": spec["schedule"],
        "timezone": spec["timezone"],
        "start_date": spec["start_date"],
        "catchup": spec["catchup"],
        "max_active_runs": spec["max_active_runs"],
        "max_active_tasks": spec["max_active_tasks"],
        "default_args": spec["default_args"],
    }
    if spec["paused"] is not None:
        values["paused"] = spec["paused"]
    changed = assign(dag, values)
    if changed & SCHEDULE_FIELDS:
        dag.next_run_logical_date = None
    if created or changed:
        dag.save()

    wanted = {task["task_id"] for task in spec["tasks"]}
    existing = {task.task_id: task for task in dag.tasks.all()} if not created else {}
    dropped = [task.pk for task_id, task in existing.items() if task_id not in wanted]
    touched = bool(changed) or bool(dropped)
    if dropped:
        Task.objects.filter(pk__in=dropped).delete()
    touched |= _write_tasks(dag, spec["tasks"], existing)
    touched |= _sync_circuits(spec)
    definitions = _deadline_rows(dag)
    by_task = {task.task_id: task for task in dag.tasks.all()} if any(t["deadlines"] for t in spec["tasks"]) or definitions else {}
    for task_spec in spec["tasks"]:
        task = by_task.get(task_spec["task_id"])
        if task_spec["deadlines"] or (task is not None and task.pk in definitions):
            touched |= sync_deadlines(dag, task, task_spec["deadlines"], definitions.get(task.pk if task else None, []))
    touched |= sync_deadlines(dag, None, spec["deadlines"], definitions.get(None, []))
    if touched and not (created or changed):
        # A new version of the DAG, for whatever caches its edges by version (engine/graph.py).
        Dag.objects.filter(pk=dag.pk).update(updated_at=timezone.now())
    if created:
        return "created"
    return "updated" if touched else "unchanged"


# Rows per INSERT or UPDATE statement of the task writes.
BATCH = 500


def _write_tasks(dag: Dag, task_specs: list[dict[str, Any]], existing: dict[str, Task]) -> bool:
    """Create and update the DAG's tasks in bulk (one INSERT or UPDATE per BATCH rows, only
    for the tasks that changed); True if any did. `existing`: the DAG's tasks as stored."""
    new: list[Task] = []
    changed: list[Task] = []
    fields: set[str] = set()
    for position, task_spec in enumerate(task_specs):
        task = existing.get(task_spec["task_id"]) or Task(dag_id=dag.pk, task_id=task_spec["task_id"])
        task_changed = assign(
            task,
            {
                "python_callable": task_spec["python_callable"],
                "bash_command": task_spec["bash_command"],
                "op_kwargs": task_spec["op_kwargs"],
                "upstream": task_spec["upstream"],
                "trigger_rule": task_spec["trigger_rule"],
                "expand": task_spec["expand"],
                "args": task_spec["args"],
                "position": position,
            },
        )
        if task.pk is None:
            new.append(task)
        elif task_changed:
            changed.append(task)
            fields |= task_changed
    Task.objects.bulk_create(new, batch_size=BATCH)
    if changed:
        Task.objects.bulk_update(changed, sorted(fields), batch_size=BATCH)
    return bool(new or changed)


def _sync_circuits(spec: DagSpec) -> bool:
    """Create the circuits the tasks name (or their DAG's default_args), so operators see them
    before their first failure."""
    default = spec["default_args"].get("circuit")
    names = {task["args"].get("circuit", default) for task in spec["tasks"]} - {None, ""}
    missing = names - set(Circuit.objects.filter(name__in=names).values_list("name", flat=True))
    Circuit.objects.bulk_create([Circuit(name=name) for name in sorted(missing)], ignore_conflicts=True)
    return False  # a circuit is shared state, not part of the DAG's definition


def _deadline_rows(dag: Dag) -> dict[int | None, list[DeadlineDefinition]]:
    """The DAG's deadline definitions by task (None: the DAG's own), in one query."""
    rows: dict[int | None, list[DeadlineDefinition]] = {}
    for row in DeadlineDefinition.objects.filter(dag=dag).order_by("position", "id"):
        rows.setdefault(row.task_id, []).append(row)
    return rows


def sync_deadlines(
    dag: Dag, task: Task | None, specs: list[dict[str, Any]], rows: list[DeadlineDefinition] | None = None
) -> bool:
    """Make the deadline definitions of `dag` (task None) or `task` match `specs`; True if any changed.

    Rows are matched by position so that an unchanged spec keeps its rows (and the
    deadlines already created from them stay linked). `rows`: the current ones, if read already.
    """
    if rows is None:
        rows = list(DeadlineDefinition.objects.filter(dag=dag, task=task).order_by("position", "id"))
    touched = False
    for position, spec in enumerate(specs):
        row = rows[position] if position < len(rows) else DeadlineDefinition(dag=dag, task=task)
        values = {name: spec[name] for name in DEADLINE_FIELDS}
        if assign(row, {**values, "position": position}) or row.pk is None:
            row.save()
            touched = True
    surplus = [row.pk for row in rows[len(specs) :]]
    if surplus:
        DeadlineDefinition.objects.filter(pk__in=surplus).delete()
        touched = True
    return touched


def refresh_fixed_datetimes(dag: Dag) -> None:
    """Recompute fixed_datetime deadlines from the text written, after the DAG's timezone changed."""
    tz = ZoneInfo(dag.timezone)
    rows = DeadlineDefinition.objects.filter(dag=dag, reference=Reference.FIXED_DATETIME).exclude(datetime_text="")
    for row in rows:
        when, _ = parse_datetime(row.datetime_text, tz)
        if when != row.datetime:
            row.datetime = when
            row.save(update_fields=["datetime"])


def assign(obj: Model, values: dict[str, Any]) -> set[str]:
    """Set attributes on `obj`; return the names of those whose value changed."""
    changed = set()
    for name, value in values.items():
        if not _same(name, getattr(obj, name), value):
            setattr(obj, name, value)
            changed.add(name)
    return changed


def _same(name: str, old: object, new: object) -> bool:
    if name in JSON_FIELDS:
        # Stricter than ==, which takes 1 for True and 2 for 2.0.
        return json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True)
    if isinstance(new, (bool, int, float, str)) and type(old) is not type(new):
        return False
    return old == new  # aware date-times compare as instants, whatever their timezone
