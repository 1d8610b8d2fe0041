"""GET /api/v1/alerts: incidents of the alert rules, open first (`alerts.documents`, the Alerts
page's query too); only the declarations and the shape of the answer live here."""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from ninja import Query, Router

from alerts import documents
from alerts.models import Delivery, Incident
from orchestrator.api.inputs import given, query_model
from orchestrator.api.schemas import component, nullable, obj, replies

STRING = {"type": "string"}
TIME = {"type": "string", "format": "date-time"}

router = Router()

DELIVERY = component(
    "AlertDelivery",
    obj(
        {
            "event": {"type": "string", "enum": Delivery.Event.values},
            "at": {**TIME, "description": "When the notification was queued."},
            "outcome": {"type": "string", "enum": ["sent", "failed", "pending"], "description": "failed: given up; pending: not sent yet."},
            "tries": {"type": "integer", "minimum": 0},
        }
    ),
)
INCIDENT = component(
    "AlertIncident",
    obj(
        {
            "id": {"type": "integer"},
            "rule": STRING,
            "group": {"type": "object", "description": "{KEY: VALUE} for the rule's group_by keys."},
            "state": {"type": "string", "enum": Incident.State.values},
            "count": {"type": "integer", "description": "How many events joined it."},
            "first_event_at": TIME,
            "last_event_at": TIME,
            "resolved_at": nullable(TIME),
            "sample": {"type": "object", "description": "The latest event: dag_id, run_id, task_id, map_index, category, reason, message."},
            "deliveries": {"type": "array", "items": DELIVERY},
        }
    ),
)
INCIDENT_LIST = component(
    "AlertIncidentList",
    obj(
        {
            "count": {"type": "integer", "description": "How many incidents match, before the limit."},
            "incidents": {"type": "array", "items": INCIDENT, "description": "Open ones first, then the latest event first."},
        }
    ),
)
AlertsQuery = query_model("AlertsQuery", documents.PARAMS)


@router.get(
    "/alerts",
    summary="Incidents of the alert rules, open first",
    tags=["alerts"],
    url_name="alerts",
    openapi_extra=replies({200: ("The matching count and the incidents.", INCIDENT_LIST)}),
)
def alert_list(request: HttpRequest, query: Query[AlertsQuery]) -> JsonResponse:  # type: ignore[valid-type]
    values = given(query)
    rows = documents.incidents(state=values["state"], rule=values["rule"])
    return JsonResponse({"count": rows.count(), "incidents": [documents.incident_document(i) for i in rows[: values["limit"]]]})
