"""GET /api/v1/audit: the audit log, newest first, read with the audit page's filter and query
(`orchestrator.console.audit`); only the declarations and the shape of the answer live here."""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from ninja import Query, Router

from orchestrator.api.inputs import given, query_model
from orchestrator.api.schemas import component, nullable, obj, replies
from orchestrator.console import audit

STRING = {"type": "string"}

router = Router()

AUDIT_ENTRY = component(
    "AuditEntry",
    {
        **obj(
            {
                "at": {"type": "string", "format": "date-time"},
                "user": {**nullable(STRING), "description": "Who acted (a user, the OS user of a command, a backfill's creator); null: the system."},
                "action": {**STRING, "description": "trigger, clear, mark_success, mark_failed, reclassify, pause, circuit_open, backfill_create, ..."},
                "dag_id": {**STRING, "description": "Empty for an entry about no DAG (a circuit)."},
                "run_id": {**STRING, "description": "Empty for an entry about no run."},
                "task_id": {**STRING, "description": "Empty for an entry about no task."},
                "map_index": {
                    **nullable({"type": "integer", "minimum": -1}),
                    "description": "The mapped task's instance acted on; -1 for a task that is not mapped; null for an entry about no task.",
                },
                "prior_state": STRING,
                "new_state": STRING,
                "note": {**STRING, "description": "The note given with the action (empty when none)."},
                "details": {"type": "object", "description": "Everything else the entry records, which depends on the action."},
            }
        ),
        "description": "One entry of the audit log: who did what to which run or task, and what it was before.",
    },
)
AUDIT_LIST = component(
    "AuditList",
    obj(
        {
            "count": {"type": "integer", "description": "How many entries match, before the limit."},
            "entries": {"type": "array", "items": AUDIT_ENTRY, "description": "The newest `limit` of them, newest first."},
        }
    ),
)
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
    openapi_extra=replies({200: ("The matching count and the newest entries.", AUDIT_LIST)}),
)
def audit_log(request: HttpRequest, query: Query[AuditQuery]) -> JsonResponse:  # type: ignore[valid-type]
    page = audit.page(audit.AuditFilter(**given(query)))
    return JsonResponse({"count": page.count, "entries": [audit.document(entry) for entry in page.rows]})
