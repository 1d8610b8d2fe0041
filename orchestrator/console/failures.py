"""The failures page: failed attempts over a window, counted every way an operator slices them.

A fixed number of queries whatever the number of attempts: one for every breakdown and the
chart's buckets together (`counted`), one for the newest rows (the output's tail only, never
whole logs). The counts come from the hourly counts kept as attempts fail
(`orchestrator.engine.failure_counts`) plus the attempts of the window's partial first hour, so
the page reads about an hour of attempts, not the whole window.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any

from django.db import connection
from django.db.models import F, QuerySet, Value
from django.db.models.expressions import Combinable
from django.db.models.fields.json import KT, KeyTextTransform, KeyTransform
from django.db.models.functions import Right, TruncDay, TruncHour, TruncMinute
from django.http import QueryDict
from django.utils import timezone

from orchestrator.console.charts import StackedChart, failures_over_time
from orchestrator.console.rootcause import spent_label
from orchestrator.console.text import error_summary
from orchestrator.data.failure_filter import failed_attempts
from orchestrator.foundation.querystring import choice, read_query, string
from orchestrator.models import FailureCount, TaskAttempt
from retries.states import Category, Reason, TaskState

# window name -> (length, bucket function, bucket label format)
WINDOWS: dict[str, tuple[timedelta, Any, str]] = {
    "1h": (timedelta(hours=1), TruncMinute, "%H:%M"),
    "6h": (timedelta(hours=6), TruncHour, "%d %H:00"),
    "24h": (timedelta(hours=24), TruncHour, "%d %H:00"),
    "7d": (timedelta(days=7), TruncDay, "%Y-%m-%d"),
    "30d": (timedelta(days=30), TruncDay, "%Y-%m-%d"),
}
BUCKET_STEP = {TruncMinute: timedelta(minutes=1), TruncHour: timedelta(hours=1), TruncDay: timedelta(days=1)}
DEFAULT_WINDOW = "24h"
ROWS = 100
TOP = 10

PARAMS = (
    choice("window", "How far back.", WINDOWS),
    choice("category", "Only failures of this category.", Category),
    choice("reason", "Only failures for this reason (the attempt's, or the task's last one).", Reason),
    string("dag_id", "Only this DAG."),
    string("owner", "Only the DAGs this team owns."),
    string("task_id", "Only this task id."),
    string("host", "Only attempts on this worker host."),
    string("fingerprint", "Only failures with this fingerprint."),
)
# breakdown title -> the column it groups by: an attempt's, and an hourly count's
BREAKDOWNS: dict[str, tuple[Combinable, Combinable]] = {
    "Category": (KT("context__category"), F("category")),
    "Reason": (KT("context__reason"), F("reason")),
    "DAG": (F("task_instance__dag_run__dag__dag_id"), F("dag__dag_id")),
    "Task": (F("task_instance__task_id"), F("task_id")),
    "Worker host": (F("hostname"), F("hostname")),
    "Fingerprint": (F("fingerprint"), F("fingerprint")),
}
CHART = "chart"
# the filter each breakdown's rows link to
BREAKDOWN_PARAM = {"Category": "category", "Reason": "reason", "DAG": "dag_id", "Task": "task_id", "Worker host": "host", "Fingerprint": "fingerprint"}


@dataclass(frozen=True)
class Filter:
    window: str
    category: str = ""
    reason: str = ""
    dag_id: str = ""
    owner: str = ""
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
    return failed_attempts(
        category=flt.category, reason=flt.reason, dag_id=flt.dag_id, task_id=flt.task_id,
        host=flt.host, fingerprint=flt.fingerprint, owner=flt.owner, since=flt.since(now),
    )  # fmt: skip


@dataclass(frozen=True)
class BreakdownCount:
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
    map_index: int
    task_reason: str  # "poisoned" on the attempt that dead-lettered its task, else ''
    budget: str  # the unit of budget the failure used: "user try 2 of 3" / "platform retry 1 of 5"
    error: str


def _attempt_keys(rows: QuerySet[TaskAttempt], trunc: Any) -> QuerySet:
    """One row per matching attempt: its key in every breakdown, its chart bucket, and 1."""
    keys = [attempt for attempt, _ in BREAKDOWNS.values()]
    return rows.order_by().values_list(*keys, trunc("end_date", tzinfo=dt_timezone.utc), Value(1))


# the filters the hourly counts can answer: parameter -> FailureCount field
_COUNTED_FILTERS = {
    "category": "category", "dag_id": "dag__dag_id", "owner": "dag__owner", "task_id": "task_id", "host": "hostname", "fingerprint": "fingerprint",
}  # fmt: skip


def _hour_keys(flt: Filter, first_hour: datetime, trunc: Any) -> QuerySet:
    """One row per hourly count from `first_hour` on: its key in every breakdown, its chart
    bucket, and how many attempts it counts."""
    counted = FailureCount.objects.filter(hour__gte=first_hour)
    for param, field in _COUNTED_FILTERS.items():
        if value := getattr(flt, param):
            counted = counted.filter(**{field: value})
    keys = [hourly for _, hourly in BREAKDOWNS.values()]
    return counted.values_list(*keys, trunc("hour", tzinfo=dt_timezone.utc), "n")


def _counted_by_hour(flt: Filter) -> bool:
    """Whether the hourly counts can answer this filter exactly. Not with minute buckets (the 1h
    window), and not with a reason: that filter also matches a dead-lettered task's attempts by
    the task's own last reason (`orchestrator.data.failure_filter`), which no count of attempts knows. Those fall
    back to scanning the window's attempts."""
    return WINDOWS[flt.window][1] is not TruncMinute and not flt.reason


def _first_whole_hour(at: datetime) -> datetime:
    at = at.astimezone(dt_timezone.utc)
    hour = at.replace(minute=0, second=0, microsecond=0)
    return hour if hour == at else hour + timedelta(hours=1)


def counted(flt: Filter, rows: QuerySet[TaskAttempt], now: datetime) -> tuple[dict[str, list[BreakdownCount]], dict[tuple[datetime, str], int]]:
    """Every breakdown and the chart's buckets (by bucket and category), in one query.

    From the hourly counts (`FailureCount`) for the whole hours of the window, plus the raw
    attempts of the partial hour at its start, so the figures are exact and the scan is at most
    an hour of attempts however long the window; from the window's attempts when the counts
    cannot answer the filter (`_counted_by_hour`)."""
    trunc = WINDOWS[flt.window][1]
    if _counted_by_hour(flt):
        first_hour = _first_whole_hour(flt.since(now))
        parts = [_hour_keys(flt, first_hour, trunc), _attempt_keys(rows.filter(end_date__lt=first_hour), trunc)]
    else:
        parts = [_attempt_keys(rows, trunc)]
    found = _grouped(parts)
    counts = {
        title: [BreakdownCount(key, n, BREAKDOWN_PARAM[title]) for key, n in sorted(found[title].items(), key=lambda kn: (-kn[1], kn[0]))[:TOP]]
        for title in BREAKDOWNS
    }
    return counts, found[CHART]


def _grouped(parts: list[QuerySet]) -> dict[str, dict[Any, int]]:
    """Sum the last column of the union of `parts` (rows of every breakdown's key, a chart
    bucket, a count) by each breakdown's column, and by (chart bucket, category) for the
    stacked chart: one GROUPING SETS query on PostgreSQL, one GROUP BY per set in a single
    UNION ALL elsewhere. The chart's keys are (bucket, category) pairs."""
    titles = [*BREAKDOWNS, CHART]
    columns = [f"c{i}" for i in range(len(titles))]
    category, bucket = columns[list(BREAKDOWNS).index("Category")], columns[-1]
    compiled = [part.query.sql_with_params() for part in parts]
    params = [param for _, part_params in compiled for param in part_params]
    matching_sql = f"WITH matching ({', '.join(columns)}, n) AS ({' UNION ALL '.join(sql for sql, _ in compiled)})"
    found: dict[str, dict[Any, int]] = {title: {} for title in titles}
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            grouping = ", ".join(f"GROUPING({c})" for c in columns)
            sets = ", ".join([*(f"({c})" for c in columns[:-1]), f"({bucket}, {category})"])
            cursor.execute(f"{matching_sql} SELECT {', '.join(columns)}, ARRAY[{grouping}], SUM(n) FROM matching GROUP BY GROUPING SETS ({sets})", params)
            rows = []
            for *values, flags, n in cursor.fetchall():
                if flags[-1] == 0:  # the chart's set: (bucket, category)
                    rows.append((len(columns) - 1, values[-1], values[columns.index(category)], n))
                else:
                    which = flags.index(0)
                    rows.append((which, values[which], None, n))
        else:
            each = [f"SELECT {i}, {c}, NULL, SUM(n) FROM matching GROUP BY {c}" for i, c in enumerate(columns[:-1])]
            each.append(f"SELECT {len(columns) - 1}, {bucket}, {category}, SUM(n) FROM matching GROUP BY {bucket}, {category}")
            cursor.execute(f"{matching_sql} {' UNION ALL '.join(each)}", params)
            rows = cursor.fetchall()
    for which, key, second, n in rows:
        title = titles[which]
        if title == CHART:
            if key is None:
                continue
            at = (datetime.fromisoformat(key) if isinstance(key, str) else key).replace(tzinfo=dt_timezone.utc)
            key = (at, str(second or ""))
        else:
            key = str(key or "")  # a count's "" and an attempt's NULL are the same key
        if n:
            found[title][key] = found[title].get(key, 0) + int(n)
    return found


def total(counts: dict[str, list[BreakdownCount]], rows: QuerySet[TaskAttempt]) -> int:
    by_category = counts["Category"]
    if len(by_category) < TOP:  # every category is listed: their sum is the total, no extra query
        return sum(c.n for c in by_category)
    return rows.count()


def chart(flt: Filter, buckets: dict[tuple[datetime, str], int], now: datetime) -> StackedChart:
    """Every bucket of the window on a time axis, each bar stacked by category."""
    length, trunc, fmt = WINDOWS[flt.window]
    step = BUCKET_STEP[trunc]
    return failures_over_time(buckets, since=flt.since(now), until=now, step=step, fmt=fmt, window=flt.window)


def newest(rows: QuerySet[TaskAttempt], limit: int = ROWS) -> list[FailureRow]:
    page = (
        rows.select_related("task_instance", "task_instance__dag_run", "task_instance__dag_run__dag")
        .defer("stdout", "stderr", "result", "task_instance__last_failure_context", "task_instance__dag_run__conf", "task_instance__dag_run__dag__default_args")
        .annotate(
            stderr_tail=Right("stderr", 600),
            task_reason=KeyTextTransform("reason", "task_instance__last_failure_context"),
            task_prior_state=KeyTextTransform("prior_state", KeyTransform("metadata", "task_instance__last_failure_context")),
        )
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
                map_index=ti.map_index,
                category=context.get("category", ""),
                reason=reason,
                task_reason=Reason.POISONED.value if _tipped(attempt, ti) else "",
                budget=spent_label(attempt.kind, attempt.try_number, attempt.infrastructure_try_number, ti.max_tries, ti.infrastructure_retry_limit),
                error=error_summary(context, attempt.stderr_tail),
            )
        )
    return out


def _tipped(attempt: Any, ti: Any) -> bool:
    """Whether this attempt dead-lettered its task: the task's latest attempt, while the task is
    dead-lettered or was when an operator marked it failed or success (its context's prior state)."""
    if attempt.attempt_token != ti.attempt_token:
        return False
    if ti.state == TaskState.DEAD_LETTER:
        return attempt.task_reason == Reason.POISONED
    return attempt.task_prior_state == TaskState.DEAD_LETTER


def page(flt: Filter, now: datetime | None = None) -> dict[str, Any]:
    now = now or timezone.now()
    rows = matching(flt, now)
    counts, buckets = counted(flt, rows, now)
    return {
        "counts": counts,
        "total": total(counts, rows),
        "chart": chart(flt, buckets, now),
        "failures": newest(rows),
    }
