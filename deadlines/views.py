"""GET /api/v1/dags/DAG_ID/deadlines/history?task_id=&last=: the hit-rate record as JSON.

With `HX-Request` (htmx) or `?format=html` it answers with the `deadlines/_history.html`
partial instead, so a page can load the same record in place.
"""
from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse

from deadlines.history import DEFAULT_LAST, MAX_LAST, history
from orchestrator.api.decorators import api_view
from orchestrator.exceptions import BadRequest, NotFound
from orchestrator.models import Dag


@api_view(["GET"])
def history_view(request: HttpRequest, dag_id: str) -> HttpResponse:
    dag = Dag.objects.filter(dag_id=dag_id).first()
    if dag is None:
        raise NotFound(f"no DAG {dag_id!r}")
    record = history(dag, task_id=request.GET.get("task_id") or None, last=_last(request.GET.get("last")))
    if request.headers.get("HX-Request") or request.GET.get("format") == "html":
        return TemplateResponse(request, "deadlines/_history.html", {"history": record})
    return JsonResponse(record)


def _last(raw: str | None) -> int:
    if raw in (None, ""):
        return DEFAULT_LAST
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LAST:
        raise BadRequest(f"last must be a whole number from 1 to {MAX_LAST}, not {raw!r}")
    return value
