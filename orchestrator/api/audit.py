"""GET /api/v1/audit: the audit log, newest first, read with the audit page's filter and query
(`orchestrator.console.audit`); only the declarations and the shape of the answer live here."""
from __future__ import annotations

from typing import Annotated, Any

from django.http import HttpRequest
from ninja import Query
from pydantic import Field

from orchestrator.api.inputs import given, query_model
from orchestrator.api.responses import Answer, Time
from orchestrator.api.routing import router_answering_as_built
from orchestrator.console import audit

router = router_answering_as_built()


class AuditEntry(Answer):
    """One entry of the audit log: who did what to which run or task, and what it was before."""

    at: Time
    user: Annotated[str | None, Field(description="Who acted (a user, the OS user of a command, a backfill's creator); null: the system.")]
    action: Annotated[str, Field(description="trigger, clear, mark_success, mark_failed, reclassify, pause, circuit_open, backfill_create, ...")]
    dag_id: Annotated[str, Field(description="Empty for an entry about no DAG (a circuit).")]
    run_id: Annotated[str, Field(description="Empty for an entry about no run.")]
    task_id: Annotated[str, Field(description="Empty for an entry about no task.")]
    map_index: Annotated[
        Annotated[int, Field(ge=-1)] | None,
        Field(description="The mapped task's instance acted on; -1 for a task that is not mapped; null for an entry about no task."),
    ]
    prior_state: str
    new_state: str
    note: Annotated[str, Field(description="The note given with the action (empty when none).")]
    details: Annotated[dict[str, Any], Field(description="Everything else the entry records, which depends on the action.")]


class AuditList(Answer):
    count: Annotated[int, Field(description="How many entries match, before the limit.")]
    entries: Annotated[list[AuditEntry], Field(description="The newest `limit` of them, newest first.")]


AuditQuery = query_model("AuditQuery", audit.PARAMS)


@router.get(
    "/audit",
    summary="The audit log, newest first",
    description=(
        "Paged like the other lists: `limit` (1 to 1000, default 100) newest entries that match, and "
        "`count`, how many match in all; to read further back, narrow the filter (e.g. `since`)."
    ),
    tags=["audit"],
    url_name="audit",
    response=AuditList,
)
def audit_log(request: HttpRequest, query: Query[AuditQuery]) -> dict[str, Any]:  # type: ignore[valid-type]
    page = audit.page(audit.AuditFilter(**given(query)))
    return {"count": page.count, "entries": [audit.document(entry) for entry in page.rows]}
