"""Import DAG spec files into the database: validate everything first, then write in one transaction.

What a DAG's import writes is worked out before that transaction (`plan_dag`: the stored tasks
read and compared, the rows to insert and update prepared), so the transaction, which on SQLite
holds the database's one write lock from its first statement, runs only the writes: a few
statements however many tasks there are. All or nothing, so the scheduler never sees a DAG half
imported. A DAG whose spec hashes as it did at its last import (`Dag.spec_hash`) is not compared
task by task at all.
"""
from __future__ import annotations

import gc
import hashlib
import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from django.db import connection, transaction
from django.db.models import Model
from django.utils import timezone

from deadlines.models import DeadlineDefinition, Reference
from orchestrator.data.sql import concrete_fields
from orchestrator.models import Circuit, Dag, Task
from orchestrator.specs.budget import spec_verdicts, warning_text
from orchestrator.specs.errors import SpecError, dag_label, located
from orchestrator.specs.files import FileError, read_spec_file, spec_paths
from orchestrator.specs.pools import known_pools, spec_pool_problems
from orchestrator.specs.schema import DagSpec, validate_dag
from orchestrator.specs.value_checks import parse_datetime
from orchestrator.specs.wait_schema import dag_run_warnings

# A change to any of these moves the DAG's next scheduled run: the scheduler recomputes it.
SCHEDULE_FIELDS = frozenset({"schedule", "start_date", "timezone"})
JSON_FIELDS = frozenset(
    {"params", "default_args", "op_kwargs", "upstream", "expand", "wait_for", "args", "callback_kwargs", "days", "skip_dates"}
)
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


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Reading a big spec allocates hundreds of thousands of containers, none of them garbage
    yet: the cyclic collector, triggered by the allocations, spent more time scanning them than
    the YAML parser spent parsing (a 10,000-task file: 4 s against 1.6 s). Reference counting
    still frees what is dropped."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load_specs(paths: Iterable[str | Path], warnings: list[str] | None = None, notices: list[str] | None = None) -> list[DagSpec]:
    """Read and validate every DAG in `paths`; raise SpecError listing every problem found.

    Retry budgets that can outlast a deadline are added to `warnings`, not problems; `dag_run`
    waits naming a DAG not (yet) defined to `notices` (to `warnings` without it), which no
    `--strict` makes an error."""
    with _no_cyclic_gc():
        return _load_specs(paths, warnings, warnings if notices is None else notices)


def _load_specs(paths: Iterable[str | Path], warnings: list[str] | None, notices: list[str] | None) -> list[DagSpec]:
    messages: list[str] = []
    specs: list[DagSpec] = []
    seen: dict[str, str] = {}
    waiting_on: list[tuple[str, str, DagSpec]] = []  # specs whose dag_run waits name a DAG (warnings)
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
                    if notices is not None:
                        waiting_on.append((raw.source, label, spec))
    if messages:
        raise SpecError(messages)
    if waiting_on and notices is not None:
        known = set(seen) | set(Dag.objects.values_list("dag_id", flat=True))
        for source, label, spec in waiting_on:
            notices += ["warning: " + located(source, label, text) for text in dag_run_warnings(spec, known)]
    return specs


def import_paths(paths: Iterable[str | Path], *, strict: bool = False) -> ImportResult:
    """Import every DAG in `paths`, all or nothing. `strict`: a retry budget that can outlast a
    deadline is an error like any other (a `dag_run` wait naming a DAG not defined yet stays a
    warning: that DAG may come with a later import)."""
    warnings: list[str] = []
    notices: list[str] = []
    specs = load_specs(paths, warnings, notices)
    if strict and warnings:
        raise SpecError([w.removeprefix("warning: ") for w in warnings])
    result = ImportResult(warnings=warnings + notices)
    plans = [plan_dag(spec) for spec in specs]  # reads only: no write lock held yet
    with transaction.atomic():
        for plan in plans:
            outcome = write_dag(plan.spec, plan)
            getattr(result, outcome).append(plan.spec["dag_id"])
    return result


# Bump when what the hash covers, or how the spec is normalised, changes.
_HASH_FORMAT = "1"


def spec_digest(spec: DagSpec) -> str:
    """The hash of a validated spec: the same spec always hashes the same. `paused` is left out:
    left unsaid it keeps what is stored, and an export says it (the DAG's row is always compared)."""
    covered = {key: value for key, value in spec.items() if key != "paused"}
    text = json.dumps(covered, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(f"{_HASH_FORMAT}:{text}".encode()).hexdigest()


def forget_spec_hash(dag_pk: int) -> None:
    """A DAG's tasks or deadlines were edited other than by an import (the admin): its next
    import compares them row by row, and what caches its edges by version reads them again."""
    Dag.objects.filter(pk=dag_pk).update(spec_hash="", updated_at=timezone.now())


# Task columns an import writes, in the order of the prepared rows.
TASK_COLUMNS = ("python_callable", "bash_command", "op_kwargs", "upstream", "trigger_rule", "expand", "wait_for", "args", "position")


@dataclass
class DagPlan:
    """What importing one validated spec writes, worked out from the stored DAG as read.

    `dag_pk`, `version` and `stored_hash`: the DAG as read (None: it did not exist), so that the
    write can tell whether anything changed it since. `tasks_unchanged`: the spec hashes as the
    stored tasks and deadlines were imported, so none of them is written."""

    spec: DagSpec
    digest: str
    dag_pk: int | None
    version: datetime | None
    stored_hash: str
    tasks_unchanged: bool
    new_rows: list[tuple[Any, ...]] = field(default_factory=list)  # task_id, then TASK_COLUMNS (prepared)
    changed_rows: list[tuple[Any, ...]] = field(default_factory=list)  # TASK_COLUMNS (prepared), then the row's id
    dropped: list[int] = field(default_factory=list)

    def matches(self, dag: Dag | None) -> bool:
        """Whether `dag` (read in the write transaction) is still the DAG this plan was made from."""
        if dag is None:
            return self.dag_pk is None
        return (dag.pk, dag.updated_at, dag.spec_hash) == (self.dag_pk, self.version, self.stored_hash)


def plan_dag(spec: DagSpec) -> DagPlan:
    """Read the stored DAG and its tasks and work out the task rows to write (no lock taken)."""
    digest = spec_digest(spec)
    stored = Dag.objects.filter(dag_id=spec["dag_id"]).values_list("pk", "updated_at", "spec_hash").first()
    if stored is None:
        plan = DagPlan(spec, digest, None, None, "", tasks_unchanged=False)
        plan.new_rows = [_prepared_row(task_spec, position, with_id=False) for position, task_spec in enumerate(spec["tasks"])]
        return plan
    dag_pk, version, stored_hash = stored
    plan = DagPlan(spec, digest, dag_pk, version, stored_hash, tasks_unchanged=stored_hash == digest)
    if plan.tasks_unchanged:
        return plan
    existing = {
        row[1]: row
        for row in Task.objects.filter(dag_id=dag_pk).values_list("pk", "task_id", *TASK_COLUMNS).order_by()
    }
    for position, task_spec in enumerate(spec["tasks"]):
        row = existing.pop(task_spec["task_id"], None)
        if row is None:
            plan.new_rows.append(_prepared_row(task_spec, position, with_id=False))
        elif any(not _same(name, old, new) for name, old, new in zip(TASK_COLUMNS, row[2:], _values(task_spec, position))):
            plan.changed_rows.append(_prepared_row(task_spec, position, with_id=row[0]))
    plan.dropped = [row[0] for row in existing.values()]
    return plan


def _values(task_spec: dict[str, Any], position: int) -> tuple[Any, ...]:
    return (*(task_spec[name] for name in TASK_COLUMNS[:-1]), position)


def _prepared_row(task_spec: dict[str, Any], position: int, *, with_id: int | bool) -> tuple[Any, ...]:
    """A task's values as the database takes them: (task_id, *TASK_COLUMNS) for an INSERT, or
    (*TASK_COLUMNS, id) for an UPDATE."""
    values = tuple(
        _TASK_FIELDS[name].get_db_prep_save(value, connection) for name, value in zip(TASK_COLUMNS, _values(task_spec, position))
    )
    return (task_spec["task_id"], *values) if with_id is False else (*values, with_id)


_TASK_FIELDS = {field.name: field for field in concrete_fields(Task, ("task_id", *TASK_COLUMNS))}


def write_dag(spec: DagSpec, plan: DagPlan | None = None) -> str:
    """Create or update one DAG from a validated spec: "created", "updated" or "unchanged".

    Tasks are matched by task_id; tasks missing from the spec are deleted (their task
    instances keep their history, with `definition` set to null). `plan`: made by `plan_dag`
    before the transaction; made again here if the DAG changed since.
    """
    dag = Dag.objects.select_for_update().filter(dag_id=spec["dag_id"]).first()
    if plan is None or plan.spec is not spec or not plan.matches(dag):
        plan = plan_dag(spec)
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
        "owner": spec["owner"],
        "max_active_tasks": spec["max_active_tasks"],
        "params": spec["params"],
        "strict_params": spec["strict_params"],
        "default_args": spec["default_args"],
    }
    if spec["paused"] is not None:
        values["paused"] = spec["paused"]
    changed = assign(dag, values)
    if changed & SCHEDULE_FIELDS:
        dag.next_run_logical_date = None
    if created or changed:
        dag.save()

    _sync_circuits(spec)
    touched = bool(changed)
    if not plan.tasks_unchanged:
        touched |= _write_tasks(dag.pk, plan)
        touched |= _write_deadlines(dag, spec)
    if touched and not (created or changed):
        # A new version of the DAG, for whatever caches its edges by version (engine/graph.py).
        Dag.objects.filter(pk=dag.pk).update(updated_at=timezone.now())
    if dag.spec_hash != plan.digest:
        Dag.objects.filter(pk=dag.pk).update(spec_hash=plan.digest)
    if created:
        return "created"
    return "updated" if touched else "unchanged"


def _write_tasks(dag_pk: int, plan: DagPlan) -> bool:
    """Write the plan's task rows: one statement for the new ones, one for the changed ones, one
    delete for the dropped ones; True if there was anything to write."""
    if plan.dropped:
        Task.objects.filter(pk__in=plan.dropped).delete()
    quote = connection.ops.quote_name
    table = quote(Task._meta.db_table)
    columns = [quote(_TASK_FIELDS[name].column) for name in TASK_COLUMNS]
    with connection.cursor() as cursor:
        if plan.new_rows:
            cursor.executemany(
                f"INSERT INTO {table} ({quote('dag_id')}, {quote('task_id')}, {', '.join(columns)})"
                f" VALUES ({', '.join(['%s'] * (len(columns) + 2))})",
                [(dag_pk, *row) for row in plan.new_rows],
            )
        if plan.changed_rows:
            cursor.executemany(
                f"UPDATE {table} SET {', '.join(f'{column} = %s' for column in columns)} WHERE {quote('id')} = %s",
                plan.changed_rows,
            )
    return bool(plan.new_rows or plan.changed_rows or plan.dropped)


def _write_deadlines(dag: Dag, spec: DagSpec) -> bool:
    """Make the deadline definitions of the DAG and of its tasks match the spec; True if any changed."""
    touched = False
    definitions = _deadline_rows(dag)
    with_deadlines = {t["task_id"] for t in spec["tasks"] if t["deadlines"]}
    task_pks = set(definitions) - {None}
    by_task: dict[str, Task] = {}
    if with_deadlines or task_pks:
        rows = Task.objects.filter(dag_id=dag.pk).values_list("pk", "task_id").order_by()
        by_task = {task_id: Task(pk=pk, dag_id=dag.pk, task_id=task_id) for pk, task_id in rows if task_id in with_deadlines or pk in task_pks}
    for task_spec in spec["tasks"]:
        task = by_task.get(task_spec["task_id"])
        if task is not None:
            touched |= sync_deadlines(dag, task, task_spec["deadlines"], definitions.get(task.pk, []))
    touched |= sync_deadlines(dag, None, spec["deadlines"], definitions.get(None, []))
    return touched


def _sync_circuits(spec: DagSpec) -> None:
    """Create the circuits the tasks name (or their DAG's default_args), so operators see them
    before their first failure."""
    default = spec["default_args"].get("circuit")
    names = {task["args"].get("circuit", default) for task in spec["tasks"]} - {None, ""}
    missing = names - set(Circuit.objects.filter(name__in=names).values_list("name", flat=True))
    # A circuit is shared state, not part of the DAG's definition: creating one changes no DAG.
    Circuit.objects.bulk_create([Circuit(name=name) for name in sorted(missing)], ignore_conflicts=True)


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
