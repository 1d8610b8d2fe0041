"""Backfills in the API: POST /dags/DAG_ID/backfills, GET /backfills/ID, POST /backfills/ID/pause|unpause|cancel."""
from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse

from orchestrator import actions, backfills
from orchestrator.api.declarations import Operation, Reply, component, json_object, nullable, request_body
from orchestrator.api.decorators import endpoint
from orchestrator.models import Backfill
from orchestrator.querystring import TEXT

INTEGER = {"type": "integer"}
TIME = {"type": "string", "format": "date-time"}
COUNT = {"type": "integer", "minimum": 0}
RUN_COUNTS = ("total", "pending", "queued", "running", "success", "failed")
ID = {"id": {"description": "The backfill's id.", "example": "1"}}

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
CREATE_BODY = {
    **request_body(
        {
            "from": {**TEXT, "description": "First date, ISO 8601 (naive: the DAG's timezone).", "example": "2026-01-01"},
            "to": {**TEXT, "description": "Last date, inclusive.", "example": "2026-01-07"},
            "reprocess": {"type": "string", "enum": Backfill.Reprocess.values, "default": "none"},
            "max_active_runs": {"type": "integer", "minimum": 1, "maximum": backfills.MAX_ACTIVE_RUNS_LIMIT, "default": backfills.DEFAULT_MAX_ACTIVE_RUNS},
            "backwards": {"type": "boolean", "default": False},
            "conf": json_object("Parameters for every run's tasks.", allow_null=True),
            "dry_run": {"type": "boolean", "default": False, "description": "Answer what each date would do; create nothing."},
        }
    ),
    "required": ["from", "to"],
}


@endpoint(
    Operation(
        "POST",
        "/dags/{dag_id}/backfills",
        "Backfill a date range: one run per logical date of the DAG's schedule",
        {201: Reply.json("The new backfill.", BACKFILL), 200: Reply.json("dry_run: what each date would do.", PREVIEW)},
        body=CREATE_BODY,
        permission=actions.TRIGGER_PERMISSION,
        tag="backfills",
    )
)
def create_backfill(request: HttpRequest, dag_id: str, body: dict[str, Any]) -> JsonResponse:
    checked = backfills.check(
        actions.find_dag(dag_id),
        start=body.get("from"),
        end=body.get("to"),
        reprocess=body.get("reprocess", "none"),
        max_active_runs=body.get("max_active_runs", backfills.DEFAULT_MAX_ACTIVE_RUNS),
        backwards=body.get("backwards", False),
        conf=body.get("conf"),
    )
    if body.get("dry_run"):
        return JsonResponse(backfills.preview_document(backfills.preview(checked)))
    return JsonResponse(backfills.document(backfills.create(checked, request.user)), status=201)


@endpoint(Operation("GET", "/backfills/{id}", "One backfill with its runs by state", {200: Reply.json("The backfill.", BACKFILL)}, path_parameters=ID, tag="backfills"))
def backfill_detail(request: HttpRequest, id: str) -> JsonResponse:
    return JsonResponse(backfills.document(backfills.find(id)))


BACKFILL_ACTIONS = {
    "pause": "Pause: none of its runs starts until it is unpaused (running ones go on)",
    "unpause": "Unpause: its runs start again on the scheduler's next pass",
    "cancel": "Cancel: its runs not started never start; running ones finish",
}


def _action_view(action: str) -> Any:
    @endpoint(
        Operation(
            "POST",
            f"/backfills/{{id}}/{action}",
            BACKFILL_ACTIONS[action],
            {200: Reply.json("The backfill after the action.", BACKFILL)},
            body=request_body({}),
            permission=actions.TRIGGER_PERMISSION,
            errors={409: "The backfill has ended (or is running, for unpause)."},
            path_parameters=ID,
            tag="backfills",
        )
    )
    def view(request: HttpRequest, id: str, body: dict[str, Any]) -> JsonResponse:
        return JsonResponse(backfills.document(backfills.act(backfills.find(id), action, request.user)))

    return view


BACKFILL_ACTION_VIEWS = {action: _action_view(action) for action in BACKFILL_ACTIONS}
