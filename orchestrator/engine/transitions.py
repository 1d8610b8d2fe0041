"""The one function that changes a task instance's state.

Every change is a conditional update on the expected prior state and the attempt token, so a
late or duplicate report (an old worker presumed lost, a second scheduler) changes nothing.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.db import connection
from django.utils import timezone

from orchestrator.data import sql
from orchestrator.models import TaskInstance
from retries.states import TaskState


def transition(
    task_instance_id: int,
    *,
    expected: Iterable[TaskState | str],
    token: int | None = None,
    **changes: Any,
) -> bool:
    """Apply `changes` if the task is in one of `expected` (and holds `token`); return whether it won."""
    statement = transition_sql(task_instance_id, expected=expected, token=token, changes=changes)
    return statement is not None and sql.execute(*statement) == 1


def transition_sql(
    task_instance_id: int, *, expected: Iterable[TaskState | str], token: int | None, changes: dict[str, Any]
) -> tuple[str, list[Any]] | None:
    """`transition` as one UPDATE statement and its parameters (None: nothing can match).

    Written SQL (`sql.py`): every attempt runs it several times."""
    states = [str(s) for s in expected]
    if not states:
        return None
    changes = {**changes}
    changes.setdefault("updated_at", timezone.now())
    assigned, params = sql.assignments(TaskInstance, changes)
    where = f"id = %s AND state IN ({sql.placeholders(len(states))})"
    params += [task_instance_id, *states]
    if token is not None:
        where += " AND attempt_token = %s"
        params.append(token)
    return f"UPDATE {TaskInstance._meta.db_table} SET {assigned} WHERE {where}", params


def transition_many(rows: Iterable[tuple[int, int, str]], *, computed: Mapping[str, str] | None = None, **changes: Any) -> set[int]:
    """Apply the same `changes` (plain values) to many task instances in one statement (SQLite:
    one per CHUNK rows), each fenced by the (attempt token, state) it was read with; return the ids that
    won. `rows` are (id, token, state). `computed`: columns set from the row's own columns, by
    field name → an SQL expression the caller writes (`attempt_token + 1`), never from data."""
    rows = list(rows)
    changes.setdefault("updated_at", timezone.now())
    assigned, values = sql.assignments(TaskInstance, changes)
    if computed:
        quote = connection.ops.quote_name
        assigned += "".join(
            f", {quote(sql.column_field(TaskInstance, name).column)} = {expression}" for name, expression in computed.items()
        )
    won: set[int] = set()
    step = max(1, len(rows)) if connection.vendor == "postgresql" else CHUNK  # PostgreSQL: arrays, any length
    for start in range(0, len(rows), step):
        chunk = rows[start : start + step]
        statement = f"UPDATE {TaskInstance._meta.db_table} SET {assigned} WHERE {fenced(len(chunk))} RETURNING id"
        won.update(pk for (pk,) in sql.fetch(statement, values + fence_params(chunk), [None]))
    return won


# Rows per statement: well under SQLite's limit of bound parameters.
CHUNK = 500


def fenced(n: int) -> str:
    """The WHERE clause fencing n rows by (id, attempt token, state). PostgreSQL: against three
    arrays (one parameter each: a 500-row list of VALUES cost more to send, split and plan than
    to run); SQLite: row values against VALUES."""
    if connection.vendor == "postgresql":
        return "(id, attempt_token, state) IN (SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::text[]))"
    return f"(id, attempt_token, state) IN (VALUES {', '.join(['(%s, %s, %s)'] * n)})"


def fence_params(rows: Iterable[tuple[int, int, str]]) -> list[Any]:
    """The parameters of `fenced` for these (id, token, state) rows."""
    if connection.vendor == "postgresql":
        rows = list(rows)
        return [[pk for pk, _, _ in rows], [token for _, token, _ in rows], [str(state) for _, _, state in rows]]
    return [value for pk, token, state in rows for value in (pk, token, str(state))]
