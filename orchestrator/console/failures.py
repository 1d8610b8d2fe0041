"""The failures page: failed attempts over a window, counted every way an operator slices them.

A fixed number of queries whatever the number of attempts: the breakdowns (on PostgreSQL all six
in one scan with GROUPING SETS; elsewhere one GROUP BY each), one for the chart's buckets, one
for the newest rows (the output's tail only, never whole logs).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.db import connection
from django.db.models import Count, F, Q, QuerySet
from django.db.models.fields.json import KT, KeyTextTransform
from django.db.models.functions import Right, TruncDay, TruncHour, TruncMinute
from django.http import QueryDict
from django.utils import timezone

from orchestrator.api.declarations import choice, read_query, string
from orchestrator.console.charts import Chart, over_time
from orchestrator.console.text import error_summary
from orchestrator.models import TaskAttempt
from retries.states import Category, Reason, TaskState

# window name -> (length, bucket function, bucket label format)
WINDOWS: dict[str, tuple[timedelta, Any, str]] = {
    "1h": (timedelta(hours=1), TruncMinute, "%H:%M"),
    "6h": (timedelta(hours=6), TruncHour, "%d %H:00"),
    "24h": (timedelta(hours=24), TruncHour, "%d %H:00"),
    "7d": (timedelta(days=7), TruncDay, "%Y-%m-%d"),
    "30d": (timedelta(days=30), TruncDay, "%Y-%m-%d"),
}
DEFAULT_WINDOW = "24h"
ROWS = 100
TOP = 10

PARAMS = (
    choice("window", "How far back.", WINDOWS),
    choice("category", "Only failures of this category.", Category),
    choice("reason", "Only failures for this reason (the attempt's, or the task's last one).", Reason),
    string("dag_id", "Only this DAG."),
    string("task_id", "Only this task id."),
    string("host", "Only attempts on this worker host."),
    string("fingerprint", "Only failures with this fingerprint."),
)
# breakdown title -> the column it groups by
BREAKDOWNS = {
    "Category": KT("context__category"),
    "Reason": KT("context__reason"),
    "DAG": F("task_instance__dag_run__dag__dag_id"),
    "Task": F("task_instance__task_id"),
    "Worker host": F("hostname"),
    "Fingerprint": F("fingerprint"),
}
# the filter each breakdown's rows link to
BREAKDOWN_PARAM = {"Category": "category", "Reason": "reason", "DAG": "dag_id", "Task": "task_id", "Worker host": "host", "Fingerprint": "fingerprint"}


@dataclass(frozen=True)
class Filter:
    window: str
    category: str = ""
    reason: str = ""
    dag_id: str = ""
    task_id: str = ""
    host: str = ""
    fingerprint: str = ""

    def since(self, now: datetime) -> datetime:
        return now - WINDOWS[self.window][0]

    def params(self, **changes: str) -> dict[str, str]:
        values = {**self.__dict__, **changes}
        return {k: v for k, v in values.items() if v}


def parse(params: QueryDict) -> Filter:
    """The page's filter (BadRequest naming a bad parameter)."""
    values = read_query(params, PARAMS)
    return Filter(**{**values, "window": values["window"] or DEFAULT_WINDOW})


def matching(flt: Filter, now: datetime) -> QuerySet[TaskAttempt]:
    rows = TaskAttempt.objects.filter(state=TaskAttempt.State.FAILED, end_date__gte=flt.since(now))
    if flt.category:
        rows = rows.filter(context__category=flt.category)
    if flt.reason:
        # A dead-lettered task's attempt keeps task_exception; the task itself reads poisoned.
        task_reason = Q(task_instance__state=TaskState.DEAD_LETTER, task_instance__last_failure_context__reason=flt.reason)
        rows = rows.filter(Q(context__reason=flt.reason) | task_reason)
    if flt.dag_id:
        rows = rows.filter(task_instance__dag_run__dag__dag_id=flt.dag_id)
    if flt.task_id:
        rows = rows.filter(task_instance__task_id=flt.task_id)
    if flt.host:
        rows = rows.filter(hostname=flt.host)
    if flt.fingerprint:
        rows = rows.filter(fingerprint=flt.fingerprint)
    return rows


@dataclass(frozen=True)
class Count_:
    key: str
    n: int
    param: str


@dataclass(frozen=True)
class FailureRow:
    attempt: TaskAttempt
    dag_id: str
    run_id: str
    task_id: str
    category: str
    reason: str
    task_reason: str  # the task's own last reason when it differs (e.g. poisoned)
    error: str


def breakdowns(rows: QuerySet[TaskAttempt]) -> dict[str, list[Count_]]:
    out = {}
    for title, column in BREAKDOWNS.items():
        counted = rows.order_by().annotate(key=column).values("key").annotate(n=Count("id")).order_by("-n", "key")[:TOP]
        out[title] = [Count_(str(r["key"] or ""), r["n"], BREAKDOWN_PARAM[title]) for r in counted]
    return out


# Each breakdown's column as SQL over the one scan below (the same columns as BREAKDOWNS).
_ONE_SCAN_COLUMNS = {
    "Category": "a.context ->> 'category'",
    "Reason": "a.context ->> 'reason'",
    "DAG": "d.dag_id",
    "Task": "ti.task_id",
    "Worker host": "a.hostname",
    "Fingerprint": "a.fingerprint",
}


_TRUNC_UNITS = {TruncMinute: "minute", TruncHour: "hour", TruncDay: "day"}
CHART = "chart"


def _counted_in_one_scan(flt: Filter, rows: QuerySet[TaskAttempt]) -> tuple[dict[str, list[Count_]], list[tuple[datetime, int]]]:
    """Every breakdown and the chart's buckets from one scan of the matching attempts
    (GROUPING SETS), not seven."""
    ids_sql, params = rows.order_by().values("id").query.sql_with_params()
    unit = _TRUNC_UNITS[WINDOWS[flt.window][1]]
    sources = {**_ONE_SCAN_COLUMNS, CHART: f"date_trunc('{unit}', a.end_date AT TIME ZONE 'UTC')"}
    titles = list(sources)
    columns = ", ".join(f"{sql} AS c{i}" for i, sql in enumerate(sources.values()))
    sets = ", ".join(f"(c{i})" for i in range(len(titles)))
    grouping = ", ".join(f"GROUPING(c{i})" for i in range(len(titles)))
    sql = f"""
        WITH matching AS (
            SELECT {columns}
            FROM orchestrator_taskattempt a
            JOIN orchestrator_taskinstance ti ON ti.id = a.task_instance_id
            JOIN orchestrator_dagrun r ON r.id = ti.dag_run_id
            JOIN orchestrator_dag d ON d.id = r.dag_id
            WHERE a.id IN ({ids_sql})
        )
        SELECT {", ".join(f"c{i}" for i in range(len(titles)))}, ARRAY[{grouping}], COUNT(*)
        FROM matching GROUP BY GROUPING SETS ({sets})
    """
    found: dict[str, list[tuple[Any, int]]] = {title: [] for title in titles}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for row in cursor.fetchall():
            *values, flags, n = row
            which = flags.index(0)  # the one column this row is grouped by
            found[titles[which]].append((values[which], n))
    counts = {
        title: [Count_(str(key or ""), n, BREAKDOWN_PARAM[title]) for key, n in sorted(found[title], key=lambda kn: (-kn[1], str(kn[0] or "")))[:TOP]]
        for title in titles
        if title != CHART
    }
    buckets = sorted((at.replace(tzinfo=dt_timezone.utc), n) for at, n in found[CHART] if at is not None)
    return counts, buckets


def total(counts: dict[str, list[Count_]], rows: QuerySet[TaskAttempt]) -> int:
    by_category = counts["Category"]
    if len(by_category) < TOP:  # every category is listed: their sum is the total, no extra query
        return sum(c.n for c in by_category)
    return rows.count()


def chart(flt: Filter, rows: QuerySet[TaskAttempt], now: datetime, buckets: list[tuple[datetime, int]] | None = None) -> Chart:
    length, trunc, fmt = WINDOWS[flt.window]
    if buckets is None:
        counted = rows.order_by().annotate(bucket=trunc("end_date")).values("bucket").annotate(n=Count("id")).order_by("bucket")
        buckets = [(r["bucket"], r["n"]) for r in counted]
    return over_time(buckets, f"Failed attempts over the last {flt.window}", fmt)


def newest(rows: QuerySet[TaskAttempt], limit: int = ROWS) -> list[FailureRow]:
    page = (
        rows.select_related("task_instance", "task_instance__dag_run", "task_instance__dag_run__dag")
        .defer("stdout", "stderr", "result", "task_instance__last_failure_context", "task_instance__dag_run__conf", "task_instance__dag_run__dag__default_args")
        .annotate(stderr_tail=Right("stderr", 600), task_reason=KeyTextTransform("reason", "task_instance__last_failure_context"))
        .order_by("-end_date", "-id")[:limit]
    )
    out = []
    for attempt in page:
        ti = attempt.task_instance
        context = attempt.context or {}
        reason = context.get("reason", "")
        out.append(
            FailureRow(
                attempt=attempt,
                dag_id=ti.dag_run.dag.dag_id,
                run_id=ti.dag_run.run_id,
                task_id=ti.task_id,
                category=context.get("category", ""),
                reason=reason,
                task_reason=attempt.task_reason if attempt.task_reason and attempt.task_reason != reason and ti.state == TaskState.DEAD_LETTER else "",
                error=error_summary(context, attempt.stderr_tail),
            )
        )
    return out


def page(flt: Filter, now: datetime | None = None) -> dict[str, Any]:
    now = now or timezone.now()
    rows = matching(flt, now)
    if connection.vendor == "postgresql":
        counts, buckets = _counted_in_one_scan(flt, rows)
    else:
        counts, buckets = breakdowns(rows), None
    return {
        "counts": counts,
        "total": total(counts, rows),
        "chart": chart(flt, rows, now, buckets),
        "failures": newest(rows),
    }
