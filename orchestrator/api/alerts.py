"""GET /api/v1/alerts: incidents of the alert rules, open first (`alerts.documents`, the Alerts
page's query too); only the declarations and the shape of the answer live here."""
from __future__ import annotations

from typing import Annotated, Any

from django.http import HttpRequest
from ninja import Query
from pydantic import Field

from alerts import documents
from alerts.models import Delivery, Incident
from orchestrator.api.inputs import given, query_model
from orchestrator.api.responses import Answer, OneOf, Time
from orchestrator.api.routing import router_answering_as_built

router = router_answering_as_built()


class AlertDelivery(Answer):
    event: Annotated[str, OneOf(Delivery.Event.values)]
    at: Annotated[Time, Field(description="When the notification was queued.")]
    outcome: Annotated[str, OneOf(["sent", "failed", "pending"]), Field(description="failed: given up; pending: not sent yet.")]
    tries: Annotated[int, Field(ge=0)]


class AlertIncident(Answer):
    id: int
    rule: str
    group: Annotated[dict[str, Any], Field(description="{KEY: VALUE} for the rule's group_by keys.")]
    state: Annotated[str, OneOf(Incident.State.values)]
    count: Annotated[int, Field(description="How many events joined it.")]
    first_event_at: Time
    last_event_at: Time
    resolved_at: Time | None
    sample: Annotated[dict[str, Any], Field(description="The latest event: dag_id, run_id, task_id, map_index, category, reason, message.")]
    deliveries: list[AlertDelivery]


class AlertIncidentList(Answer):
    count: Annotated[int, Field(description="How many incidents match, before the limit.")]
    incidents: Annotated[list[AlertIncident], Field(description="Open ones first, then the latest event first.")]


AlertsQuery = query_model("AlertsQuery", documents.PARAMS)


@router.get(
    "/alerts",
    summary="Incidents of the alert rules, open first",
    tags=["alerts"],
    url_name="alerts",
    response=AlertIncidentList,
)
def alert_list(request: HttpRequest, query: Query[AlertsQuery]) -> dict[str, Any]:  # type: ignore[valid-type]
    values = given(query)
    rows = documents.incidents(state=values["state"], rule=values["rule"])
    return {"count": rows.count(), "incidents": [documents.incident_document(i) for i in rows[: values["limit"]]]}
