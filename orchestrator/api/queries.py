"""Query parameters of the read endpoints, and the API's failures query (its filter is `orchestrator.data.failure_filter`, the failures page's too).

Parameters are declared once (orchestrator.foundation.querystring.Param) and read with those declarations by the
API and the pages alike. A bad parameter is a BadRequest naming the parameter and the value.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, QuerySet
from django.db.models.fields.json import KT
from django.http import QueryDict

from orchestrator.data import failure_filter as failure_filter_rule
from orchestrator.foundation.querystring import DEFAULT_LIMIT, LIMIT, choice, read_query, since, string
from orchestrator.models import TaskAttempt
from orchestrator.operations.documents import iso
from retries.states import Category, Reason


@dataclass(frozen=True)
class FailureFilter:
    category: str = ""
    reason: str = ""
    dag_id: str = ""
    owner: str = ""
    since: datetime | None = None
    limit: int = DEFAULT_LIMIT

    def as_params(self) -> dict[str, str]:
        """The filter as query parameters (for links that keep it)."""
        params = {"category": self.category, "reason": self.reason, "dag_id": self.dag_id, "owner": self.owner}
        if self.since is not None:
            params["since"] = self.since.isoformat()
        return {k: v for k, v in params.items() if v}


SINCE = since("Only failures that ended at or after this ISO 8601 date or date-time (naive means UTC).")
FAILURE_PARAMS = (
    choice("category", "Only failures of this category.", Category),
    choice("reason", "Only failures for this reason.", Reason),
    string("dag_id", "Only failures of this DAG."),
    string("owner", "Only failures of the DAGs this team owns."),
    SINCE,
    LIMIT,
)


def parse_failure_filter(params: QueryDict) -> FailureFilter:
    return FailureFilter(**read_query(params, FAILURE_PARAMS))


def failed_attempts(failure_filter: FailureFilter) -> QuerySet[TaskAttempt]:
    """Failed attempts matching the filter (`orchestrator.data.failure_filter`), newest first (not yet limited)."""
    rows = failure_filter_rule.failed_attempts(
        category=failure_filter.category, reason=failure_filter.reason, dag_id=failure_filter.dag_id, owner=failure_filter.owner,
        since=failure_filter.since,
    )
    return rows.select_related("task_instance", "task_instance__dag_run", "task_instance__dag_run__dag").order_by("-end_date", "-id")


def failure_counts(rows: QuerySet[TaskAttempt]) -> dict[str, dict[str, int]]:
    """How many of `rows` there are for each category and for each reason."""
    unordered = rows.order_by()
    by_category = unordered.annotate(key=KT("context__category")).values("key").annotate(n=Count("id"))
    by_reason = unordered.annotate(key=KT("context__reason")).values("key").annotate(n=Count("id"))
    return {
        "by_category": {row["key"] or "unknown": row["n"] for row in by_category.order_by("-n", "key")},
        "by_reason": {row["key"] or "unknown": row["n"] for row in by_reason.order_by("-n", "key")},
    }


def failure_document(attempt: TaskAttempt) -> dict[str, Any]:
    ti = attempt.task_instance
    return {
        "dag_id": ti.dag_run.dag.dag_id,
        "run_id": ti.dag_run.run_id,
        "task_id": ti.task_id,
        "map_index": ti.map_index,
        "try_number": attempt.try_number,
        "infrastructure_try_number": attempt.infrastructure_try_number,
        "kind": attempt.kind,
        "context": attempt.context,
        "fingerprint": attempt.fingerprint,
        "start_date": iso(attempt.start_date),
        "end_date": iso(attempt.end_date),
    }
