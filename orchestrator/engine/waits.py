"""Waiting without holding a slot: rescheduled python tasks, `wait_for` tasks, events, approvals.

A waiting task is `up_for_reschedule` and holds no worker, pool or limit slot: its wait is one
`TaskWait` row with the time of its next check. The scheduler's pass checks the due ones in
batches (`check_due`), each claimed first with a conditional update of `next_check_at` (two
schedulers never check one wait at once); an HTTP check runs on a thread of its own
(`waitchecks.HttpChecks`) and the pass only collects what it saw. A wait ends with a move of
its task fenced by state and attempt token like any report (`reporting.report_success` or
`report_failure` from `up_for_reschedule`), so a check, an event and an approval racing each
other end it once. The rules (when the next check is, when a wait times out, what is retried)
are `retries/policy.py`'s.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import PermissionsMixin
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import F

from orchestrator.data import sql
from orchestrator.data.audit import User, audit, username_of
from orchestrator.data.taskconfig import args_for
from orchestrator.engine import reporting, waitchecks
from orchestrator.engine.run_advance import advance_run_now
from orchestrator.engine.transitions import transition
from orchestrator.engine.waitstart import waiting_for
from orchestrator.exceptions import BadRequest, Conflict, Forbidden
from orchestrator.foundation.clock import shared_now
from orchestrator.foundation.results import check_result, problem_message
from orchestrator.models import APPROVE_PERMISSION, TaskAttempt, TaskInstance, TaskWait
from retries.context import ExecutionContext
from retries.policy import WaitStep, check_phase, next_check, rescheduled
from retries.states import (
    RESCHEDULE_FROM,
    WAIT_END_FROM,
    AttemptKind,
    Reason,
    Source,
    TaskState,
    WaitFor,
)

log = logging.getLogger(__name__)

# Due waits one pass checks (the oldest due first); more are left for the next pass.
CHECKS_PER_PASS = 500
# How long a claimed check is another scheduler's to leave alone: past an HTTP check's bound,
# so that only a scheduler that died with the check in hand lets it be claimed again.
CLAIM_SECONDS = 30.0


# --- a python task raised Reschedule ------------------------------------------------------------


def report_reschedule(
    task_instance_id: int,
    token: int,
    seconds: float,
    *,
    stdout: str = "",
    stderr: str = "",
    output_truncated: bool = False,
    now: datetime | None = None,
) -> WaitStep | None:
    """The worker's report of a task that raised Reschedule(seconds): its attempt ends
    `rescheduled` (kind user, no context: neither budget is charged) and the task waits,
    `up_for_reschedule`, to be sent again with the same try. Past its wait_timeout (counted
    from its first reschedule) it fails as timeout/wait_timeout instead. None: stale report."""
    now = now or shared_now()
    ti = reporting.load(task_instance_id)
    if ti is None or ti.attempt_token != token or ti.state not in RESCHEDULE_FROM:
        return None
    previous = TaskWait.objects.filter(task_instance_id=task_instance_id, kind=WaitFor.RESCHEDULE).first()
    since = previous.since if previous is not None else now
    step = rescheduled(since=since, now=now, delay=seconds, wait_timeout=float(args_for(ti)["wait_timeout"]))
    if step.timed_out:
        context = step.timeout_context(Source.WORKER, since=since.isoformat())
        decision = reporting.report_failure(
            task_instance_id, token, context, expected=RESCHEDULE_FROM, now=now, stdout=stdout, stderr=stderr, output_truncated=output_truncated
        )
        return step if decision is not None else None
    with transaction.atomic():
        moved = reporting._move_attempt(
            task_instance_id,
            token,
            RESCHEDULE_FROM,
            {
                "state": TaskState.UP_FOR_RESCHEDULE,
                "end_date": now,
                "heartbeat_at": None,
                "next_retry_at": None,
                # The next dispatch repeats this try (as a platform retry does), charging nothing.
                "retry_is_platform": True,
                "waiting_for": waiting_for(WaitFor.RESCHEDULE, since, step.next_check_at),
            },
            {
                "state": TaskAttempt.State.RESCHEDULED,
                "end_date": now,
                "kind": AttemptKind.USER,
                "context": None,
                "stdout": stdout,
                "stderr": stderr,
                "output_truncated": output_truncated,
            },
        )
        if not moved:
            return None
        TaskWait.objects.update_or_create(
            task_instance_id=task_instance_id,
            defaults={
                "kind": WaitFor.RESCHEDULE,
                "spec": {"seconds": seconds},
                "event_name": "",
                "attempt_token": token,
                "since": since,
                "timeout_at": step.timeout_at,
                "next_check_at": step.next_check_at,
                "checks": 0,
            },
        )
    log.info("task instance %s rescheduled for %s", task_instance_id, step.next_check_at)
    return step


# --- the scheduler's checks ---------------------------------------------------------------------


@dataclass
class Checked:
    checked: int = 0
    met: int = 0
    failed: int = 0
    released: int = 0  # rescheduled tasks sent back to the schedule


def check_due(now: datetime | None = None, *, limit: int = CHECKS_PER_PASS) -> Checked:
    """One look at the waits: collect the HTTP checks that ended, then claim and check the due
    waits (the oldest due first, at most `limit`). Nothing here waits for an HTTP answer."""
    now = now or shared_now()
    done = Checked()
    for wait_id, http_claim, seen in waitchecks.HttpChecks.finished():
        _settle_check(wait_id, http_claim, seen, now, done)
    in_flight = set(waitchecks.HttpChecks.pending)
    due = list(
        TaskWait.objects.filter(next_check_at__lte=now)
        .exclude(pk__in=in_flight)
        .select_related("task_instance", "task_instance__dag_run", "task_instance__dag_run__dag")
        .order_by("next_check_at", "id")[:limit]
    )
    runs_to_advance: set[int] = set()
    not_yet: list[tuple[TaskWait, waitchecks.Seen]] = []
    for wait in due:
        ti = wait.task_instance
        if ti.state != TaskState.UP_FOR_RESCHEDULE or ti.attempt_token != wait.attempt_token:
            _forget_stale(wait)
            continue
        if wait.kind == WaitFor.HTTP and now < wait.timeout_at and waitchecks.HttpChecks.free() == 0:
            continue  # every check thread is busy: left for the next pass (or another scheduler)
        in_place: waitchecks.Seen | None = None
        if _checked_in_place(wait) and now < wait.timeout_at:
            # Most checks of a time or a run find it not met: those are settled together below,
            # each fenced by the next_check_at it was read with (the claim, for one wait at a
            # time, is kept for a check that ends the wait).
            in_place = _seen(wait, ti)
            if not (in_place.met or in_place.failed):
                not_yet.append((wait, in_place))
                continue
        claimed = _claim(wait, now)
        if claimed is None:
            continue  # another scheduler has it
        done.checked += 1
        if now >= wait.timeout_at:
            step = WaitStep(True, None, wait.timeout_at)
            _fail(ti, wait, step.timeout_context(Source.SCHEDULER, since=wait.since.isoformat(), wait=wait.kind), now)
            done.failed += 1
        elif wait.kind == WaitFor.RESCHEDULE:
            if _release(ti, wait, claimed):
                done.released += 1
                runs_to_advance.add(ti.dag_run_id)
        elif wait.kind == WaitFor.HTTP:
            waitchecks.HttpChecks.submit(wait.pk, wait.spec, claimed)
        else:
            _settle_check(wait.pk, claimed, in_place if in_place is not None else _seen(wait, ti), now, done, wait=wait)
    done.checked += _settle_not_yet(not_yet, now)
    for run_id in runs_to_advance:
        advance_run_now(run_id)
    return done


def _checked_in_place(wait: TaskWait) -> bool:
    """A check the pass runs itself that only reads: a time, or another DAG's run."""
    return wait.kind in (WaitFor.TIME, WaitFor.TIME_AFTER_LOGICAL_DATE, WaitFor.DAG_RUN)


def _seen(wait: TaskWait, ti: TaskInstance) -> waitchecks.Seen:
    try:
        return _check_now(wait, ti)
    except Exception as exc:  # a spec the check cannot read: seen as not met, said so
        log.exception("wait %s of task instance %s could not be checked", wait.pk, ti.pk)
        return waitchecks.Seen(detail={"error": f"{type(exc).__name__}: {exc}"[:500]})


def _settle_not_yet(checked: list[tuple[TaskWait, waitchecks.Seen]], now: datetime) -> int:
    """Checks that found their waits not met, in one transaction of two statements: each wait's
    next check moved on (if its next_check_at is still what this pass read: another scheduler
    that got there first wins), and its task's `waiting_for` with it (if that move was this
    pass's and the task still waits under the same token). Returns how many were checked."""
    if not checked:
        return 0
    # (next check, what the check saw, wait id, next check as read, token, task instance id, waiting_for)
    rows = []
    for wait, seen in checked:
        at = _next_check_at(wait, seen, now)
        rows.append((at, _json(seen.detail), wait.pk, wait.next_check_at, wait.attempt_token, wait.task_instance_id,
                     _json(waiting_for(wait.kind, wait.since, at))))
    quote = connection.ops.quote_name
    wait_table, ti_table = quote(TaskWait._meta.db_table), quote(TaskInstance._meta.db_table)
    waiting = str(TaskState.UP_FOR_RESCHEDULE)
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # One statement each, the rows passed as arrays: a statement per row, even pipelined,
            # cost the server more than the rest of the pass.
            ats, details, pks, olds, tokens, tis, shown = (list(column) for column in zip(*rows, strict=True))
            cursor.execute(
                f"UPDATE {wait_table} AS w SET next_check_at = v.at, checks = w.checks + 1, last_check = v.detail::jsonb"
                " FROM unnest(%s::timestamptz[], %s::text[], %s::bigint[], %s::timestamptz[], %s::bigint[]) AS v(at, detail, id, old, token)"
                " WHERE w.id = v.id AND w.next_check_at = v.old AND w.attempt_token = v.token",
                [ats, details, pks, olds, tokens],
            )
            cursor.execute(
                f"UPDATE {ti_table} AS t SET waiting_for = v.shown::jsonb, updated_at = %s"
                " FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::bigint[], %s::timestamptz[]) AS v(shown, id, token, wait_id, at)"
                " WHERE t.id = v.id AND t.state = %s AND t.attempt_token = v.token"
                f" AND EXISTS (SELECT 1 FROM {wait_table} w WHERE w.id = v.wait_id AND w.next_check_at = v.at)",
                [now, shown, tis, tokens, pks, ats, waiting],
            )
        else:  # SQLite: no round trips to save
            when = TaskWait._meta.get_field("next_check_at")

            def db_time(value: datetime | None) -> Any:
                return when.get_db_prep_value(value, connection)

            cursor.executemany(
                f"UPDATE {wait_table} SET next_check_at = %s, checks = checks + 1, last_check = %s"
                " WHERE id = %s AND next_check_at = %s AND attempt_token = %s",
                [(db_time(at), detail, pk, db_time(old), token) for at, detail, pk, old, token, _, _ in rows],
            )
            cursor.executemany(
                f"UPDATE {ti_table} SET waiting_for = %s, updated_at = %s WHERE id = %s AND state = %s AND attempt_token = %s"
                f" AND EXISTS (SELECT 1 FROM {wait_table} w WHERE w.id = %s AND w.next_check_at = %s)",
                [(shown, db_time(now), ti, waiting, token, pk, db_time(at)) for at, _, pk, _, token, ti, shown in rows],
            )
    return len(checked)


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, cls=DjangoJSONEncoder)


def _check_now(wait: TaskWait, ti: TaskInstance) -> waitchecks.Seen:
    run = ti.dag_run
    if wait.kind in (WaitFor.TIME, WaitFor.TIME_AFTER_LOGICAL_DATE):
        value = wait.spec.get("value") if isinstance(wait.spec, dict) else wait.spec
        return waitchecks.check_time(waitchecks.time_target(wait.kind, value, run.logical_date, run.dag.timezone), shared_now())
    if wait.kind == WaitFor.DAG_RUN:
        return waitchecks.check_dag_run(wait.spec, run.logical_date)
    return waitchecks.NOT_YET  # an event or an approval: only its timeout is ever due


def _claim(wait: TaskWait, now: datetime) -> datetime | None:
    """This scheduler's claim of the wait's check: its `next_check_at` moved on, if it is still
    what was read. Returns the claim (the new value, which settling the check is fenced by)."""
    until = now + timedelta(seconds=CLAIM_SECONDS)
    won = TaskWait.objects.filter(pk=wait.pk, next_check_at=wait.next_check_at, attempt_token=wait.attempt_token).update(
        next_check_at=until, checks=F("checks") + 1
    )
    return until if won == 1 else None


def _settle_check(wait_id: int, claimed: datetime, seen: waitchecks.Seen, now: datetime, done: Checked, *, wait: TaskWait | None = None) -> None:
    """What a check saw, applied under its claim: the task succeeds, fails, or waits on."""
    if wait is None:
        wait = TaskWait.objects.select_related("task_instance").filter(pk=wait_id, next_check_at=claimed).first()
        if wait is None:
            return  # the claim ran out and another scheduler has it, or the wait ended
    ti = wait.task_instance
    if seen.met:
        if _complete(ti, wait, seen.result, now):
            done.met += 1
        return
    if seen.failed:
        context = ExecutionContext.of(Reason.WAIT_FAILED, Source.SCHEDULER, wait=wait.kind, **(seen.detail or {}))
        if _fail(ti, wait, context, now):
            done.failed += 1
        return
    at = _next_check_at(wait, seen, now)
    with transaction.atomic():
        if TaskWait.objects.filter(pk=wait.pk, next_check_at=claimed).update(next_check_at=at, last_check=seen.detail) == 1:
            transition(ti.pk, expected=WAIT_END_FROM, token=wait.attempt_token, waiting_for=waiting_for(wait.kind, wait.since, at))


def _next_check_at(wait: TaskWait, seen: waitchecks.Seen, now: datetime) -> datetime:
    """When a wait a check found not met is checked again: at its own phase of the interval, so
    that waits begun (or checked) together are due again spread over it, not all in one later
    pass; past its timeout, now (the next look fails it)."""
    step = next_check(
        since=wait.since,
        now=now,
        poke_interval=wait.poke_interval,
        wait_timeout=(wait.timeout_at - wait.since).total_seconds(),
        met_at=seen.met_at,
        phase=check_phase(wait.pk),
    )
    return step.next_check_at if step.next_check_at is not None else now


def _release(ti: TaskInstance, wait: TaskWait, claimed: datetime) -> bool:
    """A rescheduled task's delay is over: back to `scheduled` with the same try; the run's
    advance dispatches it through its pool and limits like any ready task."""
    with transaction.atomic():
        won = transition(ti.pk, expected=WAIT_END_FROM, token=wait.attempt_token, state=TaskState.SCHEDULED, waiting_for=None, next_retry_at=None)
        if won:
            TaskWait.objects.filter(pk=wait.pk, next_check_at=claimed).update(next_check_at=None)
    return won


def _complete(ti: TaskInstance, wait: TaskWait, result: Any, now: datetime) -> bool:
    """The wait is met: its task succeeds with `result`, once (fenced by state and token)."""
    won = reporting.report_success(ti.pk, wait.attempt_token, result=result, now=now, expected=WAIT_END_FROM)
    if won:
        TaskWait.objects.filter(pk=wait.pk, attempt_token=wait.attempt_token).delete()
    return won


def _fail(ti: TaskInstance, wait: TaskWait, context: ExecutionContext, now: datetime) -> bool:
    """The wait failed, timed out or was rejected: its task fails, not retried (policy.decide)."""
    decision = reporting.report_failure(ti.pk, wait.attempt_token, context, expected=WAIT_END_FROM, now=now)
    if decision is None:
        return False
    if wait.kind != WaitFor.RESCHEDULE:
        TaskWait.objects.filter(pk=wait.pk, attempt_token=wait.attempt_token).delete()
    else:
        TaskWait.objects.filter(pk=wait.pk, attempt_token=wait.attempt_token).update(next_check_at=None)
    return True


def _forget_stale(wait: TaskWait) -> None:
    """A due wait whose task moved on (cleared, marked): nothing to check. A rescheduled task's
    row is kept (its first reschedule counts on), only not due any more."""
    if wait.kind == WaitFor.RESCHEDULE:
        TaskWait.objects.filter(pk=wait.pk, next_check_at=wait.next_check_at).update(next_check_at=None)
    else:
        TaskWait.objects.filter(pk=wait.pk, next_check_at=wait.next_check_at).delete()


# --- operator actions on a waiting task ------------------------------------------------------------


def forget(task_instance_ids: Iterable[int]) -> None:
    """A clear: the tasks' waits are over, and a rescheduled task's next wait starts afresh."""
    TaskWait.objects.filter(task_instance_id__in=list(task_instance_ids)).delete()


def end_attempt(ti: TaskInstance, state: TaskState, context: dict[str, Any] | None, now: datetime) -> None:
    """An operator marked or cleared a waiting task: the wait's attempt ends with it (success
    for a mark success, else failed with the action's context); the wait row goes."""
    if ti.state != TaskState.UP_FOR_RESCHEDULE:
        return
    ended = TaskAttempt.State.SUCCESS if state == TaskState.SUCCESS else TaskAttempt.State.FAILED
    TaskAttempt.objects.filter(task_instance_id=ti.pk, attempt_token=ti.attempt_token, state=TaskAttempt.State.RUNNING).update(
        state=ended, end_date=now, context=None if ended == TaskAttempt.State.SUCCESS else context
    )
    TaskWait.objects.filter(task_instance_id=ti.pk).exclude(kind=WaitFor.RESCHEDULE).delete()
    TaskWait.objects.filter(task_instance_id=ti.pk, kind=WaitFor.RESCHEDULE).update(next_check_at=None)


# --- events --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Delivered:
    dag_id: str
    run_id: str
    task_id: str
    map_index: int

    def document(self) -> dict[str, Any]:
        return {"dag_id": self.dag_id, "run_id": self.run_id, "task_id": self.task_id, "map_index": self.map_index}


def check_payload(payload: Any) -> None:
    """An event's payload becomes its task's result: the result rules hold (BadRequest, 400)."""
    problem = check_result(payload, int(settings.ORCHESTRATOR_RESULT_MAX_BYTES))
    if problem is not None:
        error = BadRequest(f"payload: {problem_message(problem)}")
        error.field = "payload"
        raise error


def send_event(
    name: str,
    payload: Any = None,
    *,
    user: User = None,
    actor: str = "",
    dag_id: str | None = None,
    instances: list[TaskInstance] | None = None,
    now: datetime | None = None,
) -> list[Delivered]:
    """Deliver the event `name` with `payload`: to `instances` (a targeted event: Conflict when
    none of them waits for it, nothing changed), or else to every task waiting for that name
    (of `dag_id` only, when given). Each task it completes succeeds with the payload as its
    result and is audited."""
    check_payload(payload)
    now = now or shared_now()
    waits = TaskWait.objects.filter(kind=WaitFor.EVENT, event_name=name, task_instance__state=TaskState.UP_FOR_RESCHEDULE)
    if instances is not None:
        waits = waits.filter(task_instance__in=[ti.pk for ti in instances])
    elif dag_id:
        waits = waits.filter(task_instance__dag_run__dag__dag_id=dag_id)
    rows = list(waits.select_related("task_instance", "task_instance__dag_run", "task_instance__dag_run__dag").order_by("id"))
    delivered = []
    for wait in rows:
        ti = wait.task_instance
        if ti.attempt_token != wait.attempt_token or not _complete(ti, wait, payload, now):
            continue
        run = ti.dag_run
        details: dict[str, Any] = {"event": name, "payload": payload}
        if ti.map_index >= 0:
            details["map_index"] = ti.map_index
        audit(user, "event", run.dag.dag_id, run.run_id, ti.task_id, TaskState.UP_FOR_RESCHEDULE, TaskState.SUCCESS, details, username=actor)
        delivered.append(Delivered(run.dag.dag_id, run.run_id, ti.task_id, ti.map_index))
    if instances is not None and not delivered:
        what = instances[0].label if len(instances) == 1 else instances[0].task_id
        raise Conflict(f"task '{what}' is not waiting for the event '{name}'")
    return delivered


# --- approvals ------------------------------------------------------------------------------------


def approvers_of(ti: TaskInstance) -> list[str]:
    """The groups whose members may decide a task's approval (empty: anyone with the permission)."""
    spec = (ti.definition.wait_for or {}).get(WaitFor.APPROVAL) if ti.definition is not None else None
    return [str(group) for group in (spec or {}).get("approvers") or []]


def approval_message(ti: TaskInstance) -> str:
    spec = (ti.definition.wait_for or {}).get(WaitFor.APPROVAL) if ti.definition is not None else None
    return str((spec or {}).get("message") or "")


def refusal(user: User, ti: TaskInstance) -> str | None:
    """Why `user` may not decide this task's approval (None: they may)."""
    if not isinstance(user, PermissionsMixin) or not user.is_authenticated or not user.has_perm(APPROVE_PERMISSION):
        return f"permission '{APPROVE_PERMISSION}' required"
    groups = approvers_of(ti)
    if groups and not user.groups.filter(name__in=groups).exists():
        return f"only members of {', '.join(groups)} may decide this approval"
    return None


def may_decide(user: User, ti: TaskInstance) -> bool:
    return waits_for_approval(ti) and refusal(user, ti) is None


def waits_for_approval(ti: TaskInstance) -> bool:
    return ti.state == TaskState.UP_FOR_RESCHEDULE and (ti.waiting_for or {}).get("name") == WaitFor.APPROVAL


def decide(instances: list[TaskInstance], user: User, *, approve: bool, note: str = "", now: datetime | None = None) -> None:
    """Approve (success with `{"approved_by", "note"}`) or reject (failed as
    user_action/rejected, not retried) the approval these instances wait for. Forbidden (403)
    without the permission or, when the task names approvers, their groups; Conflict (409) when
    none of them waits for an approval. Each decision is audited."""
    for ti in instances:
        problem = refusal(user, ti)
        if problem is not None:
            raise Forbidden(problem)
    waiting = [ti for ti in instances if waits_for_approval(ti)]
    if not waiting:
        raise Conflict(f"task '{instances[0].task_id}' is not waiting for an approval")
    now = now or shared_now()
    who = username_of(user)
    for ti in waiting:
        wait = TaskWait.objects.filter(task_instance_id=ti.pk, attempt_token=ti.attempt_token, kind=WaitFor.APPROVAL).first()
        if wait is None:
            raise Conflict(f"task '{ti.label}' is not waiting for an approval")
        if approve:
            won = _complete(ti, wait, {"approved_by": who, "note": note}, now)
            new_state = TaskState.SUCCESS
        else:
            context = ExecutionContext.of(Reason.REJECTED, Source.API, user=who, note=note)
            won = _fail(ti, wait, context, now)
            new_state = TaskState.FAILED
        if not won:
            raise Conflict(f"task '{ti.label}' is no longer waiting for an approval")
        run = ti.dag_run
        details: dict[str, Any] = {"note": note}
        if ti.map_index >= 0:
            details["map_index"] = ti.map_index
        audit(user, "approve" if approve else "reject", run.dag.dag_id, run.run_id, ti.task_id, TaskState.UP_FOR_RESCHEDULE, new_state, details)


def waiting_for_approval() -> list[TaskInstance]:
    """Every task waiting for an approval, the longest waiting first (the console's list)."""
    rows = (
        TaskWait.objects.filter(kind=WaitFor.APPROVAL, task_instance__state=TaskState.UP_FOR_RESCHEDULE)
        .select_related("task_instance", "task_instance__dag_run", "task_instance__dag_run__dag", "task_instance__definition")
        .order_by("since", "id")
    )
    return [wait.task_instance for wait in rows if wait.attempt_token == wait.task_instance.attempt_token]


# --- the gauge -------------------------------------------------------------------------------------


def waiting_counts() -> dict[str, int]:
    """Tasks up_for_reschedule by what they wait for (orchestrator_waiting_tasks{kind})."""
    counts = {kind.value: 0 for kind in WaitFor}
    rows = sql.fetch(
        "SELECT w.kind, count(*) FROM orchestrator_taskwait w JOIN orchestrator_taskinstance ti ON ti.id = w.task_instance_id"
        " WHERE ti.state = %s AND ti.attempt_token = w.attempt_token GROUP BY w.kind",
        [str(TaskState.UP_FOR_RESCHEDULE)],
        [None, None],
    )
    for kind, count in rows:
        counts[kind] = int(count)
    return counts
