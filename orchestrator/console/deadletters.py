"""Dead-lettered task instances grouped by failure fingerprint, like an error tracker's issues.

Three queries whatever the history: the groups (count, first and last seen), their
instances (capped), and one sample failed attempt per fingerprint.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, F, Max, Min, Q, QuerySet, Window
from django.db.models.functions import Right, RowNumber

from orchestrator.console.text import error_summary
from orchestrator.models import TaskAttempt, TaskInstance
from retries.states import TaskState

MAX_GROUPS = 100
MAX_INSTANCES = 1000
NO_FINGERPRINT = ""


@dataclass(frozen=True)
class Member:
    dag_id: str
    run_id: str
    task_id: str
    since: datetime | None
    map_index: int = -1

    @property
    def label(self) -> str:
        return self.task_id if self.map_index < 0 else f"{self.task_id}[{self.map_index}]"

    @property
    def query(self) -> str:
        """The task page's query string that opens this instance of a mapped task."""
        return f"?map_index={self.map_index}" if self.map_index >= 0 else ""


@dataclass
class Group:
    fingerprint: str  # '' for dead letters without one
    count: int
    first_seen: datetime | None
    last_seen: datetime | None
    sample_error: str = ""
    instances: list[Member] = field(default_factory=list)

    @property
    def dag_ids(self) -> list[str]:
        return sorted({m.dag_id for m in self.instances})


def dead_letters() -> QuerySet[TaskInstance]:
    return TaskInstance.objects.filter(state=TaskState.DEAD_LETTER)


def in_group(fingerprint: str) -> QuerySet[TaskInstance]:
    """The dead-lettered task instances of one group (the bulk actions' target)."""
    rows = dead_letters().select_related("dag_run", "dag_run__dag", "definition").order_by("id")
    if fingerprint == NO_FINGERPRINT:
        return rows.filter(Q(failure_fingerprint__isnull=True) | Q(failure_fingerprint=""))
    return rows.filter(failure_fingerprint=fingerprint)


def groups(*, limit: int = MAX_GROUPS) -> list[Group]:
    """The groups, most recently seen first."""
    summary = (
        dead_letters()
        .values("failure_fingerprint")
        .annotate(n=Count("id"), first=Min("end_date"), last=Max("end_date"))
        .order_by(F("last").desc(nulls_last=True), "failure_fingerprint")[:limit]
    )
    found = {row["failure_fingerprint"] or NO_FINGERPRINT: Group(row["failure_fingerprint"] or NO_FINGERPRINT, row["n"], row["first"], row["last"]) for row in summary}
    if not found:
        return []
    members = dead_letters().values_list("dag_run__dag__dag_id", "dag_run__run_id", "task_id", "failure_fingerprint", "end_date", "map_index")
    for dag_id, run_id, task_id, fingerprint, since, map_index in members.order_by("-end_date", "-id")[:MAX_INSTANCES]:
        group = found.get(fingerprint or NO_FINGERPRINT)
        if group is not None:
            group.instances.append(Member(dag_id, run_id, task_id, since, map_index))
    samples = (
        TaskAttempt.objects.filter(fingerprint__in=[fp for fp in found if fp], state=TaskAttempt.State.FAILED)
        .annotate(
            position=Window(RowNumber(), partition_by=F("fingerprint"), order_by=[F("end_date").desc(nulls_last=True), F("id").desc()]),
            stderr_tail=Right("stderr", 600),
        )
        .filter(position=1)
        .only("fingerprint", "context")
    )
    for attempt in samples:
        found[attempt.fingerprint].sample_error = error_summary(attempt.context, attempt.stderr_tail)
    return list(found.values())


def document(group: Group) -> dict:
    """A group as /api/v1/dead_letters serves it."""
    return {
        "fingerprint": group.fingerprint or None,
        "count": group.count,
        "sample_error": group.sample_error,
        "first_seen": group.first_seen.isoformat() if group.first_seen else None,
        "last_seen": group.last_seen.isoformat() if group.last_seen else None,
        "instances": [{"dag_id": m.dag_id, "run_id": m.run_id, "task_id": m.task_id, "map_index": m.map_index} for m in group.instances],
    }
