"""Backfills in the API: POST /dags/DAG_ID/backfills, GET /backfills/ID, POST /backfills/ID/pause|unpause|cancel."""

from typing import Annotated, Literal

from django.http import HttpRequest, JsonResponse
from ninja import Router
from ninja.params.functions import Path
from pydantic import Field, StrictBool, StrictInt

from orchestrator import action_registry, actions, backfills
from orchestrator.api.access import Authenticated, require_perm
from orchestrator.api.inputs import DagId, JsonBody, JsonObject, RequestBody, Text
from orchestrator.api.schemas import component, nullable, replies
from orchestrator.models import Backfill

router = Router()

INTEGER = {"type": "integer"}
TIME = {"type": "string", "format": "date-time"}
COUNT = {"type": "integer", "minimum": 0}
RUN_COUNTS = ("total", "pending", "queued", "running", "success", "failed")
BackfillId = Annotated[Text, Path(description="The backfill's id.", example="1")]

BACKFILL = component(
    "Backfill",
    {
        "type": "object",
        "required": ["id", "dag_id", "state", "from", "to", "reprocess", "max_active_runs", "backwards", "conf", "created_by", "runs"],
        "properties": {
            "id": INTEGER,
            "dag_id": {"type": "string"},
            "state": {"type": "string", "enum": Backfill.State.values},
            "from": TIME,
            "to": TIME,
            "reprocess": {"type": "string", "enum": Backfill.Reprocess.values},
            "max_active_runs": INTEGER,
            "backwards": {"type": "boolean"},
            "conf": {"type": "object"},
            "created_by": {"type": "string"},
            "created_at": TIME,
            "end_date": nullable(TIME),
            "runs": {
                "type": "object",
                "required": list(RUN_COUNTS),
                "properties": {name: COUNT for name in RUN_COUNTS},
                "description": "total: dates it runs; pending: of those, not started yet; the others: its runs by state.",
            },
            "skipped": {**COUNT, "description": "Dates it leaves alone: a run exists that the reprocess behaviour keeps."},
            "cancelled": {**COUNT, "description": "Dates whose run never started because the backfill was cancelled."},
        },
    },
)
PREVIEW = component(
    "BackfillPreview",
    {
        "type": "object",
        "required": ["dates"],
        "properties": {
            "dates": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["logical_date", "action"],
                    "properties": {"logical_date": TIME, "action": {"type": "string", "enum": ["create", "skip", "rerun"]}},
                },
            }
        },
    },
)


class CreateBody(RequestBody):
    from_: Annotated[Text, Field(alias="from", description="First date, ISO 8601 (naive: the DAG's timezone).", examples=["2026-01-01"])]
    to: Annotated[Text, Field(description="Last date, inclusive.", examples=["2026-01-07"])]
    reprocess: Literal[tuple(Backfill.Reprocess.values)] = "none"  # type: ignore[valid-type]
    max_active_runs: Annotated[StrictInt, Field(ge=1, le=backfills.MAX_ACTIVE_RUNS_LIMIT)] = backfills.DEFAULT_MAX_ACTIVE_RUNS
    backwards: StrictBool = False
    conf: Annotated[
        JsonObject,
        Field(
            description="Parameters for every run's tasks, checked against the DAG's params once (a missing one takes its default);"
            ' a refusal is a 400 whose "field" names the key (conf.KEY).'
        ),
    ] = None
    dry_run: Annotated[StrictBool, Field(description="Answer what each date would do; create nothing.")] = False


class NoFields(RequestBody):
    """An action's body: nothing to say (an empty object, or no body)."""


@router.post(
    "/dags/{dag_id}/backfills",
    summary="Backfill a date range: one run per logical date of the DAG's schedule",
    tags=["backfills"],
    url_name="backfill_create",
    auth=Authenticated(action_registry.TRIGGER_PERMISSION),
    openapi_extra=replies({201: ("The new backfill.", BACKFILL), 200: ("dry_run: what each date would do.", PREVIEW)}),
)
def create_backfill(request: HttpRequest, dag_id: DagId, body: JsonBody[CreateBody]) -> JsonResponse:
    for permission in backfills.permissions_for(body.reprocess):
        require_perm(request, permission)
    checked = backfills.check(
        actions.find_dag(dag_id),
        start=body.from_,
        end=body.to,
        reprocess=body.reprocess,
        max_active_runs=body.max_active_runs,
        backwards=body.backwards,
        conf=body.conf,
    )
    if body.dry_run:
        return JsonResponse(backfills.preview_document(backfills.preview(checked)))
    return JsonResponse(backfills.document(backfills.create(checked, request.user)), status=201)


@router.get("/backfills/{id}", summary="One backfill with its runs by state", tags=["backfills"], url_name="backfill_detail", openapi_extra=replies({200: ("The backfill.", BACKFILL)}))
def backfill_detail(request: HttpRequest, id: BackfillId) -> JsonResponse:
    return JsonResponse(backfills.document(backfills.find(id)))


BACKFILL_ACTIONS = {
    "pause": "Pause: none of its runs starts until it is unpaused (running ones go on)",
    "unpause": "Unpause: its runs start again on the scheduler's next pass",
    "cancel": "Cancel: its runs not started never start; running ones finish",
}


def _add_action(action: str) -> None:
    def view(request: HttpRequest, id: BackfillId, body: JsonBody[NoFields]) -> JsonResponse:
        return JsonResponse(backfills.document(backfills.act(backfills.find(id), action, request.user)))

    view.__name__ = f"backfill_{action}"
    router.post(
        f"/backfills/{{id}}/{action}",
        summary=BACKFILL_ACTIONS[action],
        tags=["backfills"],
        url_name=f"backfill_{action}",
        auth=Authenticated(action_registry.TRIGGER_PERMISSION),
        openapi_extra=replies(
            {200: ("The backfill after the action.", BACKFILL)},
            errors={409: "The backfill has ended (or is running, for unpause)."},
        ),
    )(view)


for _action in BACKFILL_ACTIONS:
    _add_action(_action)
