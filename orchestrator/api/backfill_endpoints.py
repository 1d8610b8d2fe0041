"""Backfills in the API: POST /dags/DAG_ID/backfills, GET /backfills/ID, POST /backfills/ID/pause|unpause|cancel."""

from typing import Annotated, Any, Literal

from django.http import HttpRequest
from ninja import Status
from ninja.params.functions import Path
from pydantic import Field, StrictBool, StrictInt

from orchestrator.api.access import Authenticated, require_perm
from orchestrator.api.inputs import DagId, JsonObject, RequestBody, Text
from orchestrator.api.responses import Answer, OneOf, Time
from orchestrator.api.routing import add_actions, errors, router_answering_as_built
from orchestrator.models import TRIGGER_PERMISSION
from orchestrator.models import Backfill as BackfillRow
from orchestrator.operations import actions, backfills
from orchestrator.operations.action_registry import BACKFILL_ACTIONS, BackfillAction

router = router_answering_as_built()

BackfillId = Annotated[Text, Path(description="The backfill's id.", example="1")]
Count = Annotated[int, Field(ge=0)]


class RunCounts(Answer):
    """total: dates it runs; pending: of those, not started yet; the others: its runs by state."""

    total: Count
    pending: Count
    queued: Count
    running: Count
    success: Count
    failed: Count


class Backfill(Answer):
    id: int
    dag_id: str
    state: Annotated[str, OneOf(BackfillRow.State.values)]
    from_: Annotated[Time, Field(alias="from")]
    to: Time
    reprocess: Annotated[str, OneOf(BackfillRow.Reprocess.values)]
    max_active_runs: int
    backwards: bool
    conf: dict[str, Any]
    created_by: str
    created_at: Time
    end_date: Time | None
    runs: RunCounts
    skipped: Annotated[Count, Field(description="Dates it leaves alone: a run exists that the reprocess behaviour keeps.")]
    cancelled: Annotated[Count, Field(description="Dates whose run never started because the backfill was cancelled.")]


class PlannedDate(Answer):
    logical_date: Time
    action: Annotated[str, OneOf(["create", "skip", "rerun"])]


class BackfillPreview(Answer):
    dates: list[PlannedDate]


class CreateBody(RequestBody):
    from_: Annotated[Text, Field(alias="from", description="First date, ISO 8601 (naive: the DAG's timezone).", examples=["2026-01-01"])]
    to: Annotated[Text, Field(description="Last date, inclusive.", examples=["2026-01-07"])]
    reprocess: Literal[tuple(BackfillRow.Reprocess.values)] = "none"  # type: ignore[valid-type]
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
    auth=Authenticated(TRIGGER_PERMISSION),
    response={201: Backfill, 200: BackfillPreview},
)
def create_backfill(request: HttpRequest, dag_id: DagId, body: CreateBody) -> Status[dict[str, Any]]:
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
    if body.dry_run:  # what each date would do
        return Status(200, backfills.preview_document(backfills.preview(checked)))
    return Status(201, backfills.document(backfills.create(checked, request.user)))


@router.get("/backfills/{id}", summary="One backfill with its runs by state", tags=["backfills"], url_name="backfill_detail", response=Backfill)
def backfill_detail(request: HttpRequest, id: BackfillId) -> dict[str, Any]:
    return backfills.document(backfills.find(id))


def _action_view(action: BackfillAction) -> Any:
    def view(request: HttpRequest, id: BackfillId, body: NoFields = NoFields.EMPTY) -> dict[str, Any]:
        return backfills.document(backfills.act(backfills.find(id), action.name, request.user))

    return view


add_actions(
    router,
    "/backfills/{id}",
    BACKFILL_ACTIONS,
    _action_view,
    tags=["backfills"],
    url_name="backfill",
    response=Backfill,
    openapi_extra=errors({409: "The backfill has ended (or is running, for unpause)."}),
)
