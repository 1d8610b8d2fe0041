"""JSON API v1 (contract §6): thin views around orchestrator.documents and orchestrator.actions."""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from orchestrator import actions
from orchestrator.api.decorators import api_view, json_body, json_error, require_perm
from orchestrator.api.queries import (
    failed_attempts,
    failure_document,
    parse_failure_filter,
    parse_limit,
    parse_run_state,
)
from orchestrator.documents import dag_document, run_document, run_summary
from orchestrator.exceptions import BadRequest
from orchestrator.models import Dag, DagRun


def _dag_with_last_run(dag: Dag) -> dict:
    last = DagRun.objects.select_related("dag").filter(dag=dag).order_by("-queued_at", "-id").first()
    return {**dag_document(dag), "last_run": run_summary(last) if last else None}


@api_view(["GET"])
def dag_list(request: HttpRequest) -> JsonResponse:
    dags = Dag.objects.prefetch_related("tasks").order_by("dag_id")
    return JsonResponse({"dags": [_dag_with_last_run(dag) for dag in dags]})


@api_view(["GET"])
def dag_detail(request: HttpRequest, dag_id: str) -> JsonResponse:
    return JsonResponse(_dag_with_last_run(actions.find_dag(dag_id)))


@api_view(["GET", "POST"])
def dag_runs(request: HttpRequest, dag_id: str) -> JsonResponse:
    """GET: the DAG's runs, newest first (?state=, ?limit=). POST {"conf": {...}}: trigger a run."""
    dag = actions.find_dag(dag_id)
    if request.method == "POST":
        require_perm(request, actions.TRIGGER_PERMISSION)
        run = actions.trigger(dag, request.user, conf=json_body(request).get("conf"))
        return JsonResponse(run_document(run), status=201)
    state = parse_run_state(request.GET)
    limit = parse_limit(request.GET)
    runs = DagRun.objects.select_related("dag").filter(dag=dag).order_by("-queued_at", "-id")
    if state:
        runs = runs.filter(state=state)
    return JsonResponse({"dag_id": dag.dag_id, "runs": [run_summary(run) for run in runs[:limit]]})


@api_view(["GET"])
def run_detail(request: HttpRequest, dag_id: str, run_id: str) -> JsonResponse:
    return JsonResponse(run_document(actions.find_run(dag_id, run_id)))


@api_view(["POST"])
def task_action(request: HttpRequest, dag_id: str, run_id: str, task_id: str, action: str) -> JsonResponse:
    """POST .../tasks/TASK_ID/{clear,mark_success,mark_failed,reclassify}: the updated run document."""
    require_perm(request, actions.ACT_PERMISSION)
    body = json_body(request)
    note = body.get("note", "")
    if not isinstance(note, str):
        raise BadRequest(f"note must be a string, got {type(note).__name__}")
    ti = actions.find_task_instance(dag_id, run_id, task_id)
    if action == "clear":
        include_downstream = body.get("include_downstream", False)
        if not isinstance(include_downstream, bool):
            raise BadRequest(f"include_downstream must be true or false, got {include_downstream!r}")
        actions.clear(ti, request.user, include_downstream=include_downstream, note=note)
    else:
        actions.TASK_ACTIONS[action](ti, request.user, note=note)
    return JsonResponse(run_document(actions.find_run(dag_id, run_id)))


@api_view(["GET"])
def failures(request: HttpRequest) -> JsonResponse:
    """Failed attempts, newest first (?category=, ?reason=, ?dag_id=, ?since=, ?limit=)."""
    failure_filter = parse_failure_filter(request.GET)
    rows = failed_attempts(failure_filter)
    return JsonResponse(
        {"count": rows.count(), "failures": [failure_document(attempt) for attempt in rows[: failure_filter.limit]]}
    )


@api_view(["GET", "POST", "PUT", "PATCH", "DELETE"])
def not_found(request: HttpRequest) -> JsonResponse:
    """Any other path under /api/: 401 for anonymous clients like the rest, else 404."""
    return json_error(404, f"no API endpoint at {request.path}")
