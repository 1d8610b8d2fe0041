"""JSON API v1: thin views around orchestrator.documents and orchestrator.actions.

Each view is declared with `endpoint(Operation(...))`: what it takes and answers, used to
check every request and to describe the view in /api/v1/openapi.json.
"""
from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from orchestrator import actions
from orchestrator.api import schemas
from orchestrator.api.declarations import Operation, Reply, json_object, request_body
from orchestrator.api.decorators import api_view, endpoint, json_error, route
from orchestrator.api.queries import FAILURE_PARAMS, FailureFilter, failed_attempts, failure_document
from orchestrator.documents import dag_document, run_document, run_summary
from orchestrator.models import Dag, DagRun
from orchestrator.querystring import LIMIT, TEXT, choice
from retries.states import RunState

DAGS = "/dags"
DAG = "/dags/{dag_id}"
RUNS = "/dags/{dag_id}/runs"
RUN = "/dags/{dag_id}/runs/{run_id}"
TASK = "/dags/{dag_id}/runs/{run_id}/tasks/{task_id}"

NOTE = {**TEXT, "description": "Why: kept in the audit log and the task's context."}
MAP_INDEX = {
    "type": "integer",
    "minimum": 0,
    "maximum": 2**31 - 1,
    "description": "A mapped task's instance to act on; without it, every instance is acted on (each audited).",
}
ACTION_BODIES: dict[str, dict[str, Any]] = {
    "clear": request_body(
        {
            "note": NOTE,
            "map_index": MAP_INDEX,
            "include_downstream": {
                "type": "boolean",
                "default": False,
                "description": "Also clear every downstream task that is finished, waiting or dead-lettered.",
            },
            "keep_task_state": {
                "type": "boolean",
                "default": False,
                "description": "Keep the task state (and so the idempotency key); by default clearing empties it.",
            },
        }
    ),
}
NOTE_ONLY = request_body({"note": NOTE, "map_index": MAP_INDEX})
TRIGGER_BODY = request_body({"conf": json_object("Parameters for the run's tasks.", allow_null=True)})
ACTION_SUMMARIES = {
    "clear": "Run a finished, waiting or dead-lettered task again with a fresh set of tries",
    "mark_success": "Mark a task successful; its upstream_failed downstream tasks run again",
    "mark_failed": "Mark a task failed, stopping it if it is queued or running",
    "reclassify": "Charge the task's last user failure to the platform and give its retry back",
}


def _dag_with_last_run(dag: Dag) -> dict:
    last = DagRun.objects.select_related("dag").filter(dag=dag).order_by("-queued_at", "-id").first()
    return {**dag_document(dag), "last_run": run_summary(last) if last else None}


@endpoint(Operation("GET", DAGS, "List the DAGs, each with its last run", {200: Reply.json("The DAGs by id.", schemas.DAG_LIST)}, tag="dags"))
def dag_list(request: HttpRequest) -> JsonResponse:
    dags = Dag.objects.prefetch_related("tasks").order_by("dag_id")
    return JsonResponse({"dags": [_dag_with_last_run(dag) for dag in dags]})


@endpoint(Operation("GET", DAG, "One DAG with its tasks and last run", {200: Reply.json("The DAG.", schemas.DAG)}, tag="dags"))
def dag_detail(request: HttpRequest, dag_id: str) -> JsonResponse:
    return JsonResponse(_dag_with_last_run(actions.find_dag(dag_id)))


@endpoint(
    Operation(
        "GET",
        RUNS,
        "The DAG's runs, newest first",
        {200: Reply.json("Run summaries, newest first.", schemas.RUN_LIST)},
        query=(choice("state", "Only runs in this state.", RunState), LIMIT),
        tag="runs",
    )
)
def list_runs(request: HttpRequest, dag_id: str, query: dict[str, Any]) -> JsonResponse:
    dag = actions.find_dag(dag_id)
    runs = DagRun.objects.select_related("dag").filter(dag=dag).order_by("-queued_at", "-id")
    if query["state"]:
        runs = runs.filter(state=query["state"])
    return JsonResponse({"dag_id": dag.dag_id, "runs": [run_summary(run) for run in runs[: query["limit"]]]})


@endpoint(
    Operation(
        "POST",
        RUNS,
        "Trigger a manual run",
        {201: Reply.json("The new run.", schemas.RUN)},
        body=TRIGGER_BODY,
        permission=actions.TRIGGER_PERMISSION,
        errors={409: "The DAG is paused."},
        tag="runs",
    )
)
def trigger_run(request: HttpRequest, dag_id: str, body: dict[str, Any]) -> JsonResponse:
    run = actions.trigger(actions.find_dag(dag_id), request.user, conf=body.get("conf"))
    return JsonResponse(run_document(run), status=201)


dag_runs = route(list_runs, trigger_run)


@endpoint(Operation("GET", RUN, "One run with its task instances, attempts and deadlines", {200: Reply.json("The run.", schemas.RUN)}, tag="runs"))
def run_detail(request: HttpRequest, dag_id: str, run_id: str) -> JsonResponse:
    return JsonResponse(run_document(actions.find_run(dag_id, run_id)))


def task_action(request: HttpRequest, dag_id: str, run_id: str, task_id: str, action: str, body: dict[str, Any]) -> JsonResponse:
    """POST .../tasks/TASK_ID/ACTION: the updated run document."""
    instances = actions.find_task_instances(dag_id, run_id, task_id, body.get("map_index"))
    options = (
        {"include_downstream": body.get("include_downstream", False), "keep_task_state": body.get("keep_task_state", False)}
        if action == "clear"
        else {}
    )
    actions.act_on_task(action, instances, request.user, note=body.get("note", ""), **options)
    return JsonResponse(run_document(actions.find_run(dag_id, run_id)))


def _task_action_view(action: str) -> Any:
    return endpoint(
        Operation(
            "POST",
            f"{TASK}/{action}",
            ACTION_SUMMARIES.get(action, action.replace("_", " ").capitalize()),
            {200: Reply.json("The run after the action.", schemas.RUN)},
            body=ACTION_BODIES.get(action, NOTE_ONLY),
            permission=actions.ACT_PERMISSION,
            errors={
                404: "No such DAG, run, task, or map_index.",
                409: "The task's state (every instance's, for a mapped task) does not allow this action now.",
            },
            tag="tasks",
        )
    )(task_action)


TASK_ACTION_VIEWS = {action: _task_action_view(action) for action in actions.TASK_ACTIONS}


@endpoint(
    Operation(
        "GET",
        "/failures",
        "Failed attempts across DAGs, newest first",
        {200: Reply.json("The matching count and the newest failures.", schemas.FAILURE_LIST)},
        query=FAILURE_PARAMS,
        tag="failures",
    )
)
def failures(request: HttpRequest, query: dict[str, Any]) -> JsonResponse:
    failure_filter = FailureFilter(**query)
    rows = failed_attempts(failure_filter)
    return JsonResponse(
        {"count": rows.count(), "failures": [failure_document(attempt) for attempt in rows[: failure_filter.limit]]}
    )


@api_view(["GET", "POST", "PUT", "PATCH", "DELETE"])
def not_found(request: HttpRequest) -> HttpResponse:
    """Any other path under /api/: 401 for anonymous clients like the rest, else 404."""
    return json_error(404, f"no API endpoint at {request.path}")
