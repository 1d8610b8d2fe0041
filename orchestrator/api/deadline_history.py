"""GET /api/v1/dags/DAG_ID/deadlines/history?task_id=&last=: the hit-rate record as JSON.

With `HX-Request` (htmx) or `?format=html` it answers with the `deadlines/_history.html`
partial instead, so a page can load the same record in place.
"""
from typing import Annotated

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from ninja import Query
from pydantic import Field

from deadlines.history import DEFAULT_LAST, MAX_LAST, history
from orchestrator.api.inputs import DagId, given, query_model
from orchestrator.api.responses import Answer, Time
from orchestrator.api.routing import router_answering_as_built
from orchestrator.exceptions import NotFound
from orchestrator.foundation.querystring import choice, integer, string
from orchestrator.models import Dag

Seconds = float | None


class DeadlineSummary(Answer):
    total: int
    pending: int
    at_risk: int
    met: int
    missed: int
    warned: int
    hit_rate: Annotated[float | None, Field(description="met / (met + missed); null before any deadline settled.")]
    median_lateness_seconds: Seconds
    mean_lateness_missed_seconds: Seconds
    max_lateness_seconds: Seconds


class RecentDeadline(Answer):
    run_id: str
    logical_date: Time | None
    task_id: str | None
    reference: str
    need_by: Time | None
    state: str
    lateness_seconds: Seconds
    warned: bool
    callback_state: str | None


class DeadlineHistory(Answer):
    dag_id: str
    task_id: str | None
    last: int
    runs: Annotated[int, Field(description="How many runs the record covers.")]
    summary: DeadlineSummary
    recent: list[RecentDeadline]
    tasks: Annotated[
        dict[str, DeadlineSummary], Field(description="Without task_id: each task's own deadlines, by task id.")
    ] = {}


HistoryQuery = query_model(
    "DeadlineHistoryQuery",
    (
        string("task_id", "One task's deadlines instead of the DAG's."),
        integer("last", "How many of the newest runs to cover.", maximum=MAX_LAST, default=DEFAULT_LAST),
        choice("format", "html for the page's partial.", ["json", "html"]),
    ),
)
router = router_answering_as_built()


@router.get(
    "/dags/{dag_id}/deadlines/history",
    summary="How often the DAG (or one task) met its deadlines over its last runs",
    tags=["deadlines"],
    url_name="deadline_history",
    response=DeadlineHistory,
    # The same record as the page's partial, with ?format=html or an HX-Request header.
    openapi_extra={"responses": {200: {"content": {"text/html": {"schema": {"type": "string"}}}}}},
)
def history_view(request: HttpRequest, dag_id: DagId, query: Query[HistoryQuery]) -> HttpResponse | dict:  # type: ignore[valid-type]
    dag = Dag.objects.filter(dag_id=dag_id).first()
    if dag is None:
        raise NotFound(f"no DAG {dag_id!r}")
    values = given(query)
    record = history(dag, task_id=values["task_id"] or None, last=values["last"])
    if request.headers.get("HX-Request") or values["format"] == "html":
        return TemplateResponse(request, "deadlines/_history.html", {"history": record})
    return record
