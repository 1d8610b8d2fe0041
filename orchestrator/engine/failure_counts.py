"""Failed attempts counted per UTC hour and key (`FailureCount`) as they fail.

The failures page sums these rows for the whole hours of its window instead of scanning every
failed attempt in it. They stay exact because `count()` runs in the transaction of every write
that makes an attempt `failed` or changes what a failed attempt is counted under:

- `reporting.report_failure()` (a worker's report, and the scheduler's lost tasks and jobs);
- `actions.mark_failed()` of queued or running tasks (their attempts end `failed`: `count_attempts()`);
- `actions.reclassify()`: `count(..., -1)` before the attempt's context changes, `count()` after.

Nothing on the success path calls it. `backfill()` counts what failed before the table existed
(migration 0003; the console benchmark's loaded history).
"""
from __future__ import annotations

import functools

from django.db import connection as default_connection
from django.db.backends.base.base import BaseDatabaseWrapper

from orchestrator.models import DagRun, FailureCount, TaskAttempt, TaskInstance

KEY = ("hour", "dag_id", "task_id", "category", "reason", "hostname", "fingerprint")


@functools.lru_cache(maxsize=4)
def _upsert_sql(vendor: str, where: str) -> str:
    """Add `%s` × the failed attempts matching `where` to their keys' rows, in one statement.

    One INSERT ... SELECT ... GROUP BY ... ON CONFLICT DO UPDATE: PostgreSQL and SQLite (3.24+)
    both have it. SQLite needs the SELECT to have a WHERE (it always does here)."""
    if vendor == "postgresql":
        hour = "date_trunc('hour', a.end_date, 'UTC')"
        category, reason = "a.context ->> 'category'", "a.context ->> 'reason'"
    else:  # SQLite: datetimes are stored as UTC text
        hour = "strftime('%%Y-%%m-%%d %%H:00:00', a.end_date)"
        category, reason = "json_extract(a.context, '$.category')", "json_extract(a.context, '$.reason')"
    key = [hour, "r.dag_id", "ti.task_id", f"COALESCE({category}, '')", f"COALESCE({reason}, '')", "a.hostname", "COALESCE(a.fingerprint, '')"]
    table = FailureCount._meta.db_table
    return f"""
        INSERT INTO {table} ({", ".join(KEY)}, n)
        SELECT {", ".join(key)}, %s * COUNT(*)
        FROM {TaskAttempt._meta.db_table} a
        JOIN {TaskInstance._meta.db_table} ti ON ti.id = a.task_instance_id
        JOIN {DagRun._meta.db_table} r ON r.id = ti.dag_run_id
        WHERE a.state = '{TaskAttempt.State.FAILED}' AND a.end_date IS NOT NULL{where}
        GROUP BY {", ".join(key)}
        ON CONFLICT ({", ".join(KEY)}) DO UPDATE SET n = {table}.n + excluded.n
    """


def count(task_instance_id: int, token: int, sign: int = 1) -> None:
    """Count the attempt (`sign=-1`: uncount it) under its key as it is now; nothing if it is
    not `failed`. Call inside the transaction that wrote the attempt."""
    sql = _upsert_sql(default_connection.vendor, " AND a.task_instance_id = %s AND a.attempt_token = %s")
    with default_connection.cursor() as cursor:
        cursor.execute(sql, [sign, task_instance_id, token])


def count_attempts(attempt_ids: list[int]) -> None:
    """`count()` for many attempts at once (a mark_failed of many queued or running tasks)."""
    if not attempt_ids:
        return
    # Not cached: the statement's text varies with the number of attempts.
    sql = _upsert_sql.__wrapped__(default_connection.vendor, f" AND a.id IN ({', '.join(['%s'] * len(attempt_ids))})")
    with default_connection.cursor() as cursor:
        cursor.execute(sql, [1, *attempt_ids])


def uncount_task_instances(task_instance_ids: list[int]) -> None:
    """Take the failed attempts of these task instances out of the counts (their history is
    being deleted), and drop the rows left at zero. Call in the transaction that deletes them."""
    if not task_instance_ids:
        return
    sql = _upsert_sql(default_connection.vendor, f" AND a.task_instance_id IN ({', '.join(['%s'] * len(task_instance_ids))})")
    with default_connection.cursor() as cursor:
        cursor.execute(sql, [-1, *task_instance_ids])
    FailureCount.objects.filter(n__lte=0).delete()


def backfill(connection: BaseDatabaseWrapper = default_connection) -> None:
    """Count every failed attempt; for a table that holds no counts yet."""
    with connection.cursor() as cursor:
        cursor.execute(_upsert_sql(connection.vendor, ""), [1])
