"""Events and approvals in the API: what completes a task waiting for one (engine/waits.py).

POST .../tasks/TASK_ID/events, POST /events (broadcast), POST .../tasks/TASK_ID/approve and
.../reject. Thin views: a lookup, one call of engine.waits, the run document.
"""
from typing import Annotated, Any

from django.http import HttpRequest
from pydantic import Field, StrictInt

from orchestrator.api.access import Authenticated
from orchestrator.api.inputs import DagId, RequestBody, RunId, TaskId, Text, check_no_nul
from orchestrator.api.responses import Answer, Run
from orchestrator.api.routing import add_actions, errors, router_answering_as_built
from orchestrator.engine import waits
from orchestrator.models import TRIGGER_PERMISSION
from orchestrator.operations import actions
from orchestrator.operations.action_registry import APPROVAL_ACTIONS, APPROVAL_NOTE, ApprovalAction
from orchestrator.operations.documents import run_document

router = router_answering_as_built()

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
    note: Annotated[Text, Field(description=APPROVAL_NOTE)] = ""
    map_index: MapIndex = None  # type: ignore[assignment]


class Completed(Answer):
    dag_id: str
    run_id: str
    task_id: str
    map_index: int


class Delivered(Answer):
    delivered: Annotated[list[Completed], Field(description="Each task the event completed.")]


def _actor(request: HttpRequest) -> Any:
    return request.user


@router.post(
    f"{TASK}/events",
    summary="Send an event to a task waiting for it: it succeeds with the payload as its result",
    tags=["waits"],
    url_name="task_event",
    auth=Authenticated(TRIGGER_PERMISSION),
    response=Run,
    openapi_extra=errors({404: "No such DAG, run, task, or map_index.", 409: "The task is not waiting for that event: nothing changed."}),
)
def task_event(request: HttpRequest, dag_id: DagId, run_id: RunId, task_id: TaskId, body: TaskEventBody) -> dict[str, Any]:
    check_no_nul(body.payload, "payload")
    instances = actions.find_task_instances(dag_id, run_id, task_id, body.map_index)
    waits.send_event(body.name, body.payload, user=_actor(request), instances=instances)
    return run_document(actions.find_run(dag_id, run_id))


@router.post(
    "/events",
    summary="Send an event to every task waiting for it (of one DAG, when given)",
    tags=["waits"],
    url_name="events",
    auth=Authenticated(TRIGGER_PERMISSION),
    response=Delivered,
)
def broadcast_event(request: HttpRequest, body: EventBody) -> dict[str, Any]:
    check_no_nul(body.payload, "payload")
    delivered = waits.send_event(body.name, body.payload, user=_actor(request), dag_id=body.dag_id or None)
    return {"delivered": [d.document() for d in delivered]}


def _decision_view(action: ApprovalAction) -> Any:
    def view(request: HttpRequest, dag_id: DagId, run_id: RunId, task_id: TaskId, body: DecisionBody = DecisionBody.EMPTY) -> dict[str, Any]:
        instances = actions.find_task_instances(dag_id, run_id, task_id, body.map_index)
        waits.decide(instances, _actor(request), approve=action.approves, note=body.note)
        return run_document(actions.find_run(dag_id, run_id))

    return view


add_actions(
    router,
    TASK,
    APPROVAL_ACTIONS,
    _decision_view,
    tags=["waits"],
    url_name="task",
    response=Run,
    openapi_extra=errors(
        {
            403: "Without orchestrator.approve_taskinstance, or not in one of the task's approvers groups.",
            404: "No such DAG, run, task, or map_index.",
            409: "The task is not waiting for an approval.",
        }
    ),
)
