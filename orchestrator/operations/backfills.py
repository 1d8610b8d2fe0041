"""Backfills for the command, the API and the pages: create (or preview), pause, unpause, cancel.

Every argument is checked before anything is written; a bad one raises `BackfillError`, which
names the argument (`from`, `to`, `reprocess`, ...), or, for a conf the DAG's params refuse,
`params.ParamError`, which names the key (`conf.KEY`); and nothing is created. The runs
themselves are started by the scheduler (`orchestrator.engine.backfill_runs.start_runs`). Each
action is audited with who did it.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import connection, transaction

from orchestrator.data.audit import User, audit, username_of
from orchestrator.engine import backfill_runs as engine
from orchestrator.exceptions import BadRequest, Conflict, NotFound
from orchestrator.foundation.clock import shared_now
from orchestrator.foundation.run_params import resolve_conf
from orchestrator.models import ACT_PERMISSION, TRIGGER_PERMISSION, Backfill, BackfillDate, Dag
from orchestrator.operations.action_registry import BACKFILL_ACTIONS, BackfillAction
from orchestrator.operations.documents import iso

DEFAULT_MAX_ACTIVE_RUNS = 10
MAX_ACTIVE_RUNS_LIMIT = 10_000
# Dates a schedule can be walked over without leaving what datetime and croniter can represent.
MIN_YEAR, MAX_YEAR = 1900, 2999
FINAL_STATES = frozenset({Backfill.State.SUCCESS, Backfill.State.FAILED, Backfill.State.CANCELLED})


class BackfillError(BadRequest):
    """A bad argument: `argument` is its name (as in the API's body; the command adds `--`)."""

    def __init__(self, argument: str, problem: str) -> None:
        self.argument, self.problem = argument, problem
        super().__init__(f"{argument}: {problem}")


@dataclass(frozen=True)
class Request:
    """A checked backfill request."""

    dag: Dag
    start: datetime
    end: datetime
    reprocess: str
    max_active_runs: int
    backwards: bool
    conf: dict[str, Any]
    dates: list[datetime]


def parse_when(argument: str, value: object, tz_name: str) -> datetime:
    """An ISO 8601 date or date-time; a naive one is in the DAG's timezone."""
    if not isinstance(value, str) or not value.strip():
        raise BackfillError(argument, f"must be an ISO 8601 date or date-time, not {_show(value)}")
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise BackfillError(argument, f"not an ISO 8601 date or date-time: {_show(value)}") from None
    if not MIN_YEAR <= when.year <= MAX_YEAR:
        raise BackfillError(argument, f"must lie between the years {MIN_YEAR} and {MAX_YEAR}, not {_show(value)}")
    if when.tzinfo is None:
        when = when.replace(tzinfo=ZoneInfo(tz_name))
    return when


def check(
    dag: Dag,
    *,
    start: object,
    end: object,
    reprocess: object = Backfill.Reprocess.NONE,
    max_active_runs: object = DEFAULT_MAX_ACTIVE_RUNS,
    backwards: object = False,
    conf: object = None,
) -> Request:
    """Every argument checked, the dates computed; BackfillError naming the first bad argument."""
    if not dag.schedule:
        raise BackfillError("dag_id", f"DAG '{dag.dag_id}' has no schedule: a backfill makes one run per scheduled date")
    begin = parse_when("from", start, dag.timezone)
    finish = parse_when("to", end, dag.timezone)
    if begin > finish:
        raise BackfillError("from", f"{begin.isoformat()} is after to ({finish.isoformat()})")
    if reprocess not in Backfill.Reprocess.values:
        raise BackfillError("reprocess", f"must be one of {', '.join(Backfill.Reprocess.values)}, not {_show(reprocess)}")
    if isinstance(max_active_runs, bool) or not isinstance(max_active_runs, int) or not 1 <= max_active_runs <= MAX_ACTIVE_RUNS_LIMIT:
        raise BackfillError("max_active_runs", f"must be a whole number from 1 to {MAX_ACTIVE_RUNS_LIMIT}, not {_show(max_active_runs)}")
    if not isinstance(backwards, bool):
        raise BackfillError("backwards", f"must be true or false, not {_show(backwards)}")
    if conf is not None and not isinstance(conf, dict):
        raise BackfillError("conf", f"must be a JSON object, not {_show(conf)}")
    # Every run of the backfill gets this conf: checked against the DAG's params once, here.
    conf = resolve_conf(dag.params, dag.strict_params, conf)
    limit = int(settings.ORCHESTRATOR_BACKFILL_MAX_RUNS)
    dates = engine.logical_dates(dag, begin, finish, limit)
    if len(dates) > limit:
        raise BackfillError("to", f"the range holds more than ORCHESTRATOR_BACKFILL_MAX_RUNS ({limit}) dates of the schedule; backfill a shorter range")
    if not dates:
        raise BackfillError("from", f"no date of the schedule '{dag.schedule}' ({dag.timezone}) lies between {begin.isoformat()} and {finish.isoformat()}")
    return Request(dag, begin, finish, str(reprocess), max_active_runs, backwards, conf, dates)


def permissions_for(reprocess: str) -> tuple[str, ...]:
    """What a user needs to create (or preview) a backfill: triggering runs; and, when it may
    re-run existing runs (`reprocess` other than none), acting on task instances too, since a
    re-run clears their tasks as an operator's clear does. The command line has no user and
    needs none, as for every command."""
    if reprocess == Backfill.Reprocess.NONE:
        return (TRIGGER_PERMISSION,)
    return (TRIGGER_PERMISSION, ACT_PERMISSION)


def preview(request: Request) -> list[engine.PlannedDate]:
    """What the backfill would do at each date now, in the order it would start them."""
    return engine.plan(request.dag, request.dates, request.reprocess, backwards=request.backwards)


def create(request: Request, user: User, *, created_by: str | None = None) -> Backfill:
    """Create the backfill and its dates in one transaction; the scheduler starts its runs."""
    by = created_by if created_by is not None else username_of(user)
    now = shared_now()
    with transaction.atomic():
        backfill = Backfill.objects.create(
            dag=request.dag,
            from_date=request.start,
            to_date=request.end,
            reprocess=request.reprocess,
            max_active_runs=request.max_active_runs,
            backwards=request.backwards,
            conf=request.conf,
            created_by=by,
            created_at=now,
        )
        BackfillDate.objects.bulk_create(
            [
                BackfillDate(
                    backfill=backfill,
                    logical_date=planned.logical_date,
                    action=planned.action,
                    state=BackfillDate.State.SKIPPED if planned.action == BackfillDate.Action.SKIP else BackfillDate.State.PENDING,
                    dag_run_id=planned.run_id,
                )
                for planned in preview(request)
            ],
            batch_size=500,
        )
        audit(user, "backfill_create", request.dag.dag_id, "", "", "", backfill.state, {"backfill_id": backfill.pk, **_arguments(backfill), "created_by": by})
    return backfill


def find(backfill_id: int | str) -> Backfill:
    backfill = Backfill.objects.select_related("dag").filter(pk=int(backfill_id)).first() if str(backfill_id).isdigit() and len(str(backfill_id)) <= 18 else None
    if backfill is None:
        raise NotFound(f"no backfill with id {backfill_id!r}")
    return backfill


# The state each action moves to (from its `allowed_from` in the registry).
MOVES_TO = {
    "pause": Backfill.State.PAUSED,
    "unpause": Backfill.State.RUNNING,
    "cancel": Backfill.State.CANCELLED,
}


def moves_from(backfill: Backfill) -> list[BackfillAction]:
    """The actions the backfill's state allows now: what its page offers."""
    return [action for action in BACKFILL_ACTIONS.values() if backfill.state in action.allowed_from]


def act(backfill: Backfill, action: str, user: User) -> Backfill:
    """Pause, unpause or cancel; takes effect on the scheduler's next pass. Doing it again is a
    no-op; a finished backfill (or unpausing a running one) is a Conflict.

    Cancelled: its dates not started never start (they end `cancelled`); its running runs finish."""
    allowed, target = BACKFILL_ACTIONS[action].allowed_from, MOVES_TO[action]
    with transaction.atomic():
        rows = Backfill.objects.filter(pk=backfill.pk)
        if connection.vendor == "postgresql":
            rows = rows.select_for_update()  # waits for a scheduler starting its runs
        current = rows.get()
        if current.state == target:
            return current
        if current.state not in allowed:
            raise Conflict(f"backfill {backfill.pk} is {current.state}: it cannot be {action}d")
        prior = current.state
        now = shared_now()
        changes: dict[str, Any] = {"state": target}
        if action == "cancel":
            changes["end_date"] = now
            BackfillDate.objects.filter(backfill=current, state=BackfillDate.State.PENDING).update(state=BackfillDate.State.CANCELLED)
        Backfill.objects.filter(pk=current.pk, state=prior).update(**changes)
        audit(user, f"backfill_{action}", current.dag.dag_id, "", "", prior, target, {"backfill_id": current.pk})
    current.refresh_from_db()
    return current


def is_over(backfill: Backfill) -> bool:
    """Finished, or cancelled with none of its runs still going: what `--wait` waits for."""
    return backfill.state in FINAL_STATES and not engine.active_runs(backfill.pk)


def document(backfill: Backfill) -> dict[str, Any]:
    counts = engine.run_counts(backfill.pk)
    return {
        "id": backfill.pk,
        "dag_id": backfill.dag.dag_id,
        "state": backfill.state,
        **_arguments(backfill),
        "created_by": backfill.created_by,
        "created_at": iso(backfill.created_at),
        "end_date": iso(backfill.end_date),
        "runs": {key: counts[key] for key in ("total", "pending", "queued", "running", "success", "failed")},
        "skipped": counts["skipped"],
        "cancelled": counts["cancelled"],
    }


def preview_document(planned: list[engine.PlannedDate]) -> dict[str, Any]:
    return {"dates": [{"logical_date": iso(p.logical_date), "action": str(p.action)} for p in planned]}


def _arguments(backfill: Backfill) -> dict[str, Any]:
    return {
        "from": iso(backfill.from_date.astimezone(dt_timezone.utc)),
        "to": iso(backfill.to_date.astimezone(dt_timezone.utc)),
        "reprocess": backfill.reprocess,
        "max_active_runs": backfill.max_active_runs,
        "backwards": backfill.backwards,
        "conf": backfill.conf,
    }


def _show(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

