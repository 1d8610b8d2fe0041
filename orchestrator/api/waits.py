"""Events and approvals in the API: what completes a task waiting for one (engine/waits.py).

POST .../tasks/TASK_ID/events, POST /events (broadcast), POST .../tasks/TASK_ID/approve and
.../reject. Thin views: a lookup, one call of engine.waits, the run document.
"""
from typing import Annotated, Any

from django.http import HttpRequest, JsonResponse
from ninja import Router
from pydantic import Field, StrictInt

from orchestrator import action_registry, actions
from orchestrator.api import schemas
from orchestrator.api.access import Authenticated
from orchestrator.api.inputs import DagId, JsonBody, RequestBody, RunId, TaskId, Text, check_no_nul
from orchestrator.api.schemas import obj, replies
from orchestrator.documents import run_document
from orchestrator.engine import waits

router = Router()

TASK = "/dags/{dag_id}/runs/{run_id}/tasks/{task_id}"
MapIndex = Annotated[StrictInt, Field(ge=0, le=2**31 - 1, description="A mapped task's instance; without it, every instance of the task.")]
Payload = Annotated[
    Any,
    Field(
        description="Any JSON value: the task's result. It follows the result rules (JSON, at most ORCHESTRATOR_RESULT_MAX_BYTES"
        " encoded, nested at most 64 levels); past them: 400."
    ),
]
EventName = Annotated[Text, Field(min_length=1, max_length=250, description="The event's name (a task's wait_for.event.name).")]


class TaskEventBody(RequestBody):
    name: EventName
    payload: Payload = None
    map_index: MapIndex = None  # type: ignore[assignment]  # absent: every instance; null is refused


class EventBody(RequestBody):
    name: EventName
    payload: Payload = None
    dag_id: Annotated[Text, Field(description="Only tasks of this DAG; absent: every DAG.")] = None  # type: ignore[assignment]


class DecisionBody(RequestBody):
    note: Annotated[Text, Field(description="Why: kept with the decision and in the audit log.")] = ""
    map_index: MapIndex = None  # type: ignore[assignment]


DELIVERED = obj(
    {
        "delivered": {
            "type": "array",
            "description": "Each task the event completed.",
            "items": obj({"dag_id": schemas.STRING, "run_id": schemas.STRING, "task_id": schemas.STRING, "map_index": schemas.INTEGER}),
        }
    }
)


def _actor(request: HttpRequest) -> Any:
    return request.user


@router.post(
    f"{TASK}/events",
    summary="Send an event to a task waiting for it: it succeeds with the payload as its result",
    tags=["waits"],
    url_name="task_event",
    auth=Authenticated(action_registry.TRIGGER_PERMISSION),
    openapi_extra=replies(
        {200: ("The run, the task completed.", schemas.RUN)},
        errors={404: "No such DAG, run, task, or map_index.", 409: "The task is not waiting for that event: nothing changed."},
    ),
)
def task_event(request: HttpRequest, dag_id: DagId, run_id: RunId, task_id: TaskId, body: JsonBody[TaskEventBody]) -> JsonResponse:
    check_no_nul(body.payload, "payload")
    instances = actions.find_task_instances(dag_id, run_id, task_id, body.map_index)
    waits.send_event(body.name, body.payload, user=_actor(request), instances=instances)
    return JsonResponse(run_document(actions.find_run(dag_id, run_id)))


@router.post(
    "/events",
    summary="Send an event to every task waiting for it (of one DAG, when given)",
    tags=["waits"],
    url_name="events",
    auth=Authenticated(action_registry.TRIGGER_PERMISSION),
    openapi_extra=replies({200: ("The tasks it completed (an empty list when none waited).", DELIVERED)}),
)
def broadcast_event(request: HttpRequest, body: JsonBody[EventBody]) -> JsonResponse:
    check_no_nul(body.payload, "payload")
    delivered = waits.send_event(body.name, body.payload, user=_actor(request), dag_id=body.dag_id or None)
    return JsonResponse({"delivered": [d.document() for d in delivered]})


def _add_decision(action: str, summary: str) -> None:
    def view(request: HttpRequest, dag_id: DagId, run_id: RunId, task_id: TaskId, body: JsonBody[DecisionBody]) -> JsonResponse:
        instances = actions.find_task_instances(dag_id, run_id, task_id, body.map_index)
        waits.decide(instances, _actor(request), approve=action == "approve", note=body.note)
        return JsonResponse(run_document(actions.find_run(dag_id, run_id)))

    view.__name__ = f"task_{action}"
    router.post(
        f"{TASK}/{action}",
        summary=summary,
        tags=["waits"],
        url_name=f"task_{action}",
        auth=Authenticated(waits.APPROVE_PERMISSION),
        openapi_extra=replies(
            {200: ("The run after the decision.", schemas.RUN)},
            errors={
                403: "Without orchestrator.approve_taskinstance, or not in one of the task's approvers groups.",
                404: "No such DAG, run, task, or map_index.",
                409: "The task is not waiting for an approval.",
            },
        ),
    )(view)


_add_decision("approve", "Approve a task waiting for an approval: it succeeds with {approved_by, note}")
_add_decision("reject", "Reject a task waiting for an approval: it fails as user_action/rejected, not retried")
