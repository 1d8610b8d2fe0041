"""The Alerts page: incidents of the alert rules, open first, with their deliveries, and the
rules themselves (secrets masked). Filtered as `GET /api/v1/alerts` is (`alerts.documents`)."""
from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.views.decorators.http import require_GET

from alerts import documents
from alerts.models import Incident
from orchestrator.exceptions import BadRequest
from orchestrator.foundation.querystring import read_query


@login_required
@require_GET
def alerts(request: HttpRequest) -> HttpResponse:
    context: dict[str, Any] = {"params": request.GET, "states": Incident.State.values, "rules": documents.rule_rows()}
    try:
        values = read_query(request.GET, documents.PARAMS)
    except BadRequest as exc:
        context["filter_error"] = str(exc)
        return TemplateResponse(request, "web/alerts.html", context, status=400)
    rows = documents.incidents(state=values["state"], rule=values["rule"])
    incidents = list(rows[: values["limit"]])
    context.update(count=rows.count(), incidents=incidents)
    return TemplateResponse(request, "web/alerts.html", context)
