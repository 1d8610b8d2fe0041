"""GET /api/v1/dags/DAG_ID/deadlines/history?task_id=&last=: the hit-rate record as JSON.

With `HX-Request` (htmx) or `?format=html` it answers with the `deadlines/_history.html`
partial instead, so a page can load the same record in place.
"""
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from ninja import Query, Router

from deadlines.history import DEFAULT_LAST, MAX_LAST, history
from orchestrator.api.inputs import DagId, given, query_model
from orchestrator.api.schemas import component, nullable, replies
from orchestrator.exceptions import NotFound
from orchestrator.models import Dag
from orchestrator.querystring import choice, integer, string

NUMBER = nullable({"type": "number"})
SUMMARY = component(
    "DeadlineSummary",
    {
        "type": "object",
        "required": ["total", "pending", "met", "missed", "warned", "hit_rate"],
        "properties": {
            "total": {"type": "integer"},
            "pending": {"type": "integer"},
            "met": {"type": "integer"},
            "missed": {"type": "integer"},
            "warned": {"type": "integer"},
            "hit_rate": {**NUMBER, "description": "met / (met + missed); null before any deadline settled."},
            "median_lateness_seconds": NUMBER,
            "mean_lateness_missed_seconds": NUMBER,
            "max_lateness_seconds": NUMBER,
        },
    },
)
HISTORY = component(
    "DeadlineHistory",
    {
        "type": "object",
        "required": ["dag_id", "task_id", "last", "runs", "summary", "recent"],
        "properties": {
            "dag_id": {"type": "string"},
            "task_id": nullable({"type": "string"}),
            "last": {"type": "integer"},
            "runs": {"type": "integer", "description": "How many runs the record covers."},
            "summary": SUMMARY,
            "recent": {"type": "array", "items": {"type": "object"}},
            "tasks": {
                "type": "object",
                "additionalProperties": SUMMARY,
                "description": "Without task_id: each task's own deadlines, by task id.",
            },
        },
    },
)


HistoryQuery = query_model(
    "DeadlineHistoryQuery",
    (
        string("task_id", "One task's deadlines instead of the DAG's."),
        integer("last", "How many of the newest runs to cover.", maximum=MAX_LAST, default=DEFAULT_LAST),
        choice("format", "html for the page's partial.", ["json", "html"]),
    ),
)
router = Router()


@router.get(
    "/dags/{dag_id}/deadlines/history",
    summary="How often the DAG (or one task) met its deadlines over its last runs",
    tags=["deadlines"],
    url_name="deadline_history",
    openapi_extra=replies(
        {
            200: (
                "The record; HTML (the page's partial) with ?format=html or an HX-Request header.",
                {"application/json": HISTORY, "text/html": {"type": "string"}},
            )
        }
    ),
)
def history_view(request: HttpRequest, dag_id: DagId, query: Query[HistoryQuery]) -> HttpResponse:  # type: ignore[valid-type]
    dag = Dag.objects.filter(dag_id=dag_id).first()
    if dag is None:
        raise NotFound(f"no DAG {dag_id!r}")
    values = given(query)
    record = history(dag, task_id=values["task_id"] or None, last=values["last"])
    if request.headers.get("HX-Request") or values["format"] == "html":
        return TemplateResponse(request, "deadlines/_history.html", {"history": record})
    return JsonResponse(record)
