"""Incidents as the API answers them and the Alerts page shows them: open first, then the
latest event first. Nothing here shows a rule's notify_kwargs."""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db.models import Case, IntegerField, Prefetch, QuerySet, Value, When

from alerts import masking, spec
from alerts.models import AlertRule, Delivery, Incident, IncidentFeed
from orchestrator.foundation.querystring import LIMIT, choice, string

# The filter of GET /api/v1/alerts and the Alerts page, read alike by both.
PARAMS = (
    choice("state", "Only incidents in this state.", Incident.State.values),
    string("rule", "Only this rule's incidents."),
    LIMIT,
)


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def incidents(*, state: str = "", rule: str = "", task_instance_id: int | None = None) -> QuerySet[Incident]:
    """The incidents that match, open first, each with its rule and deliveries (unlimited)."""
    rows = Incident.objects.select_related("rule").prefetch_related(
        Prefetch("deliveries", queryset=Delivery.objects.order_by("at", "id"))
    )
    if state:
        rows = rows.filter(state=state)
    if rule:
        rows = rows.filter(rule__name=rule)
    if task_instance_id is not None:
        fed = IncidentFeed.objects.filter(task_instance_id=task_instance_id).values("incident_id")
        rows = rows.filter(pk__in=fed)
    open_first = Case(When(state=Incident.State.OPEN, then=Value(0)), default=Value(1), output_field=IntegerField())
    return rows.annotate(open_first=open_first).order_by("open_first", "-last_event_at", "-id")


def outcome(delivery: Delivery) -> str:
    return {Delivery.State.SENT: "sent", Delivery.State.FAILED: "failed"}.get(Delivery.State(delivery.state), "pending")


def incident_document(incident: Incident) -> dict[str, Any]:
    return {
        "id": incident.pk,
        "rule": incident.rule.name,
        "group": incident.group,
        "state": incident.state,
        "count": incident.count,
        "first_event_at": iso(incident.first_event_at),
        "last_event_at": iso(incident.last_event_at),
        "resolved_at": iso(incident.resolved_at),
        "sample": incident.sample,
        "deliveries": [
            {"event": d.event, "at": iso(d.at), "outcome": outcome(d), "tries": d.tries} for d in incident.deliveries.all()
        ],
    }


def rule_rows() -> list[dict[str, Any]]:
    """Every rule as the Alerts page lists it: its notify_kwargs masked."""
    return [
        {**spec.export(rule), "notify_kwargs_text": json.dumps(masking.mask(rule.notify_kwargs), sort_keys=True)}
        for rule in AlertRule.objects.order_by("name")
    ]
