"""DAGs, runs, task actions and failures: thin views around orchestrator.operations.documents and orchestrator.operations.actions."""

from typing import Annotated, Any

from django.http import HttpRequest
from ninja import Query, Status
from pydantic import Field, StrictBool, StrictInt, create_model

from orchestrator.api.access import Authenticated
from orchestrator.api.inputs import DagId, JsonObject, LogicalDate, RequestBody, RunId, TaskId, Text, given, query_model
from orchestrator.api.queries import FAILURE_PARAMS, FailureFilter, failed_attempts, failure_document
from orchestrator.api.responses import Dag as DagAnswer
from orchestrator.api.responses import DagList, FailureList, Run, RunList
from orchestrator.api.routing import add_actions, errors, router_answering_as_built
from orchestrator.foundation.querystring import LIMIT, choice
from orchestrator.models import Dag, DagRun
from orchestrator.operations import actions
from orchestrator.operations.action_registry import DAG_ACTIONS, TASK_ACTIONS, TASK_MAP_INDEX, TASK_NOTE, TaskAction
from orchestrator.operations.documents import dag_document, run_document, run_summary
from retries.states import RunState

router = router_answering_as_built()

DAGS = "/dags"
DAG = "/dags/{dag_id}"
RUNS = "/dags/{dag_id}/runs"
RUN = "/dags/{dag_id}/runs/{run_id}"
TASK = "/dags/{dag_id}/runs/{run_id}/tasks/{task_id}"

Note = Annotated[Text, Field(description=TASK_NOTE)]
MapIndex = Annotated[StrictInt, Field(ge=0, le=2**31 - 1, description=TASK_MAP_INDEX)]


class TaskActionBody(RequestBody):
    note: Note = ""
    map_index: MapIndex = None  # type: ignore[assignment]  # absent: every instance; null is refused


def _body_of(action: TaskAction) -> type[TaskActionBody]:
    """The action's request body: a note, a map_index, and its options (ClearBody for clear)."""
    if not action.options:
        return TaskActionBody
    options: dict[str, Any] = {o.name: (Annotated[StrictBool, Field(description=o.description)], False) for o in action.options}
    name = "".join(word.capitalize() for word in action.name.split("_")) + "Body"
    return create_model(name, __base__=TaskActionBody, __module__=__name__, **options)


class TriggerBody(RequestBody):
    conf: Annotated[
        JsonObject,
        Field(
            description="Parameters for the run's tasks, checked against the DAG's params (a missing one takes its default);"
            ' a refusal is a 400 whose "field" names the key (conf.KEY).'
        ),
    ] = None
    logical_date: Annotated[
        LogicalDate,
        Field(
            description="The run's logical date: ISO 8601, naive in the DAG's timezone; absent or null: the time it is queued."
            ' One that is not ISO 8601 is a 400 whose "field" is logical_date.'
        ),
    ] = None


RunsQuery = query_model("RunsQuery", (choice("state", "Only runs in this state.", RunState), LIMIT))
FailuresQuery = query_model("FailuresQuery", FAILURE_PARAMS)


def _dag_with_last_run(dag: Dag) -> dict[str, Any]:
    last = DagRun.objects.select_related("dag").filter(dag=dag).order_by("-queued_at", "-id").first()
    return {**dag_document(dag), "last_run": run_summary(last) if last else None}


@router.get(DAGS, summary="List the DAGs, each with its last run", tags=["dags"], url_name="dag_list", response=DagList)
def dag_list(request: HttpRequest) -> dict[str, Any]:
    dags = Dag.objects.prefetch_related("tasks").order_by("dag_id")
    return {"dags": [_dag_with_last_run(dag) for dag in dags]}


@router.get(DAG, summary="One DAG with its tasks and last run", tags=["dags"], url_name="dag_detail", response=DagAnswer)
def dag_detail(request: HttpRequest, dag_id: DagId) -> dict[str, Any]:
    return _dag_with_last_run(actions.find_dag(dag_id))


@router.get(RUNS, summary="The DAG's runs, newest first", tags=["runs"], url_name="dag_runs", response=RunList)
def list_runs(request: HttpRequest, dag_id: DagId, query: Query[RunsQuery]) -> dict[str, Any]:  # type: ignore[valid-type]
    dag, values = actions.find_dag(dag_id), given(query)
    runs = DagRun.objects.select_related("dag").filter(dag=dag).order_by("-queued_at", "-id")
    if values["state"]:
        runs = runs.filter(state=values["state"])
    return {"dag_id": dag.dag_id, "runs": [run_summary(run) for run in runs[: values["limit"]]]}


@router.post(
    RUNS,
    summary="Trigger a manual run",
    tags=["runs"],
    auth=Authenticated(DAG_ACTIONS["trigger"].permission),
    response={201: Run},
    openapi_extra=errors({409: "The DAG is paused."}),
)
def trigger_run(request: HttpRequest, dag_id: DagId, body: TriggerBody = TriggerBody.EMPTY) -> Status[dict[str, Any]]:
    triggered = actions.trigger_known(actions.find_dag(dag_id), request.user, conf=body.conf, logical_date=body.logical_date)
    return Status(201, run_document(triggered.run, known=triggered.instances))


@router.get(RUN, summary="One run with its task instances, attempts and deadlines", tags=["runs"], url_name="run_detail", response=Run)
def run_detail(request: HttpRequest, dag_id: DagId, run_id: RunId) -> dict[str, Any]:
    return run_document(actions.find_run(dag_id, run_id))


def task_action(request: HttpRequest, dag_id: str, run_id: str, task_id: str, action: TaskAction, body: TaskActionBody) -> dict[str, Any]:
    """POST .../tasks/TASK_ID/ACTION: the updated run document."""
    instances = actions.find_task_instances(dag_id, run_id, task_id, body.map_index)
    options = {option.name: getattr(body, option.name) for option in action.options}
    actions.act_on_task(action.name, instances, request.user, note=body.note, **options)
    return run_document(actions.find_run(dag_id, run_id))


def _task_action_view(action: TaskAction) -> Any:
    """The view of one registered task action, taking its own body."""
    Body = _body_of(action)  # noqa: N806 (a class)

    def view(request: HttpRequest, dag_id: DagId, run_id: RunId, task_id: TaskId, body: Body = Body.EMPTY) -> dict[str, Any]:  # type: ignore[valid-type]  # the action's own body
        return task_action(request, dag_id, run_id, task_id, action, body)

    return view


add_actions(
    router,
    TASK,
    TASK_ACTIONS,
    _task_action_view,
    tags=["tasks"],
    url_name="task",
    response=Run,
    openapi_extra=errors(
        {
            404: "No such DAG, run, task, or map_index.",
            409: "The task's state (every instance's, for a mapped task) does not allow this action now.",
        },
    ),
)


@router.get(
    "/failures",
    summary="Failed attempts across DAGs, newest first",
    tags=["failures"],
    url_name="failures",
    response=FailureList,
)
def failures(request: HttpRequest, query: Query[FailuresQuery]) -> dict[str, Any]:  # type: ignore[valid-type]
    failure_filter = FailureFilter(**given(query))
    rows = failed_attempts(failure_filter)
    return {"count": rows.count(), "failures": [failure_document(attempt) for attempt in rows[: failure_filter.limit]]}
