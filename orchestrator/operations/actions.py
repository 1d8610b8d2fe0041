"""Operator actions: trigger, clear, mark success, mark failed, reclassify.

The JSON API and the web pages both call these functions; they hold every rule of what an
operator may do to a run or task. Each action:

- changes task states only through `orchestrator.engine.transitions.transition()`, with the state it
  read and the attempt token as the condition, so an action never overwrites a change a worker
  or scheduler made meanwhile (it fails with `Conflict` instead and changes nothing);
- sets the task's `last_failure_context` to a `user_action` context (source `api`, metadata
  `user`, `note`, `prior_state`, plus `at`);
- writes one `AuditLog` row (who, what, the prior and new state, and what else it touched)
  through `orchestrator.data.audit.audit()`, the one writer of the audit log;
- reopens a finished run when the change means the run is no longer finished, then calls
  `advance_run()`, which settles downstream tasks, dispatches ready ones and ends the run.

Tasks that a worker may hold (`queued`, `running`) are acted on only by `mark_failed`, which
stops them: it wins the task from the worker (state and token fenced), the worker's next
heartbeat is refused and it kills the task's group. Other actions on them: `Conflict` (409).

Which actions a task allows now, and why not, is `refusal()`: the actions refuse by it and the
pages offer their buttons by it (`allowed_actions()`), so a page never offers what an action
refuses. Each task action is declared, with the states it acts from and the permission it
needs, in `orchestrator.operations.action_registry`; its function here is named in `IMPLEMENTATIONS`.
Who may act is `may_*()` here.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AnonymousUser, PermissionsMixin
from django.db import transaction
from django.db.models import QuerySet

from deadlines import lifecycle
from orchestrator.data import metrics, sql
from orchestrator.data.audit import User, audit, audit_many, username_of
from orchestrator.engine import circuits, clearing, failure_counts, task_state_store, waits
from orchestrator.engine.reporting import budget_of
from orchestrator.engine.rules import run_outcome
from orchestrator.engine.run_advance import advance_run_now
from orchestrator.engine.run_creation import ManualRun, trigger_manual_run
from orchestrator.engine.run_reads import run_named
from orchestrator.engine.transitions import transition, transition_many
from orchestrator.exceptions import ActionError, Conflict, NotFound
from orchestrator.foundation.clock import shared_now
from orchestrator.models import ACT_PERMISSION, PAUSE_PERMISSION, TRIGGER_PERMISSION, AuditLog, Circuit, Dag, DagRun, TaskAttempt, TaskInstance
from orchestrator.operations.action_registry import TASK_ACTIONS
from retries.context import ExecutionContext
from retries.policy import reclassified
from retries.states import (
    ACTIVE_TASK_STATES,
    CLEAR_DOWNSTREAM_FROM,
    FINISHED_RUN_STATES,
    AttemptKind,
    Reason,
    RunState,
    Source,
    TaskState,
)

log = logging.getLogger(__name__)

def may_trigger(user: User) -> bool:
    return _has_perm(user, TRIGGER_PERMISSION)


def may_act(user: User) -> bool:
    return _has_perm(user, ACT_PERMISSION)


def may_pause(user: User) -> bool:
    return _has_perm(user, PAUSE_PERMISSION)


def _has_perm(user: User, permission: str) -> bool:
    return isinstance(user, (PermissionsMixin, AnonymousUser)) and user.has_perm(permission)


# --- lookups ------------------------------------------------------------------------------------


def find_dag(dag_id: str) -> Dag:
    # Written SQL, as the reads below: every request of the API starts with one of them.
    fields = sql.concrete_fields(Dag)
    rows = sql.fetch(
        f"SELECT {sql.columns('d', fields)} FROM {Dag._meta.db_table} d WHERE d.dag_id = %s", [dag_id], fields, prepare=True  # by its unique key
    )
    if not rows:
        raise NotFound(f"unknown DAG '{dag_id}'")
    return sql.instances(Dag, fields, rows[0])


def find_run(dag_id: str, run_id: str) -> DagRun:
    """The run with its DAG, in one read; which of them is missing is asked only when one is."""
    run = run_named(dag_id, run_id)
    if run is None:
        find_dag(dag_id)
        raise NotFound(f"DAG '{dag_id}' has no run '{run_id}'")
    return run


def dag_of_run(run_id: str) -> str:
    """The DAG whose run is `run_id`, for a caller that named the run alone: refused when no DAG
    has such a run, or when more than one does (the DAG must then be named)."""
    dag_ids = sorted(set(DagRun.objects.filter(run_id=run_id).values_list("dag__dag_id", flat=True)[:10]))
    if not dag_ids:
        raise NotFound(f"no DAG has a run '{run_id}'")
    if len(dag_ids) > 1:
        raise ActionError(f"run '{run_id}' is a run of more than one DAG ({', '.join(dag_ids)}): name the DAG")
    return dag_ids[0]


def find_task_instance(dag_id: str, run_id: str, task_id: str, map_index: int | None = None) -> TaskInstance:
    """One task instance: a mapped task's instance `map_index`, or else the task's first."""
    return find_task_instances(dag_id, run_id, task_id, map_index)[0]


def find_task_instances(dag_id: str, run_id: str, task_id: str, map_index: int | None = None) -> list[TaskInstance]:
    """The task's instances in map_index order (one unless it is mapped), or only `map_index`."""
    run = find_run(dag_id, run_id)
    rows = TaskInstance.objects.select_related("dag_run", "dag_run__dag", "definition").filter(dag_run=run, task_id=task_id)
    # Unless asked for by its index, not a former instance parked while its task is unexpanded.
    rows = rows.filter(map_index=map_index) if map_index is not None else rows.filter(map_index__gte=-1)
    found = list(rows.order_by("map_index"))
    if not found:
        if map_index is not None and TaskInstance.objects.filter(dag_run=run, task_id=task_id).exists():
            raise NotFound(f"task '{task_id}' of run '{run_id}' of DAG '{dag_id}' has no map_index {map_index}")
        raise NotFound(f"run '{run_id}' of DAG '{dag_id}' has no task '{task_id}'")
    return found


def act_on_task(
    action: str, instances: list[TaskInstance], user: User, *, note: str = "", **options: Any
) -> list[AuditLog]:
    """One action on a task's instances (a mapped task's every instance, or one), each audited.

    An instance whose state refuses the action is skipped when others were acted on; when none
    could be, the first refusal is raised. Clear, mark success and mark failed act on all the
    others at once, in one transaction: one that changed meanwhile makes the whole action a
    Conflict that changes nothing.
    """
    if action == "reclassify":  # each on its own: which attempt it moves is the instance's own
        entries: list[AuditLog] = []
        refused: list[ActionError] = []
        for ti in instances:
            try:
                entries.append(reclassify(ti, user, note=note))
            except ActionError as exc:
                refused.append(exc)
        if not entries and refused:
            raise refused[0]
        return entries
    allowed = [ti for ti in instances if not refusal(action, ti, user_failed=False)]
    if not allowed:
        if instances:
            raise Conflict(refusal(action, instances[0], user_failed=False))
        return []
    return BULK_ACTIONS[action](allowed, user, note=note, **options)


# --- what an action allows now -------------------------------------------------------------------


def refusal(action: str, ti: TaskInstance, *, user_failed: bool) -> str:
    """Why `action` may not be taken on `ti` now, in words; '' when it may.

    The one rule: the actions refuse by it (a `Conflict` with these words) and the pages offer
    their buttons by it (`allowed_actions`). `user_failed`: whether the task has a
    user-charged failed attempt, which only reclassify needs.
    """
    declared = TASK_ACTIONS[action]
    verb = declared.verb
    if ti.map_index >= 0 and ti.state == TaskState.REMOVED:
        return f"cannot {verb} task '{ti.label}': it was removed when its task expanded over a shorter list"
    if ti.state not in declared.allowed_from:
        if ti.state in ACTIVE_TASK_STATES:
            return f"cannot {verb} task '{ti.label}' while it is {ti.state}; wait for it to finish"
        return f"cannot {verb} task '{ti.label}': it is {ti.state}"
    if action == "reclassify" and not user_failed:
        return f"task '{ti.label}' has no user-charged failed attempt to reclassify"
    return ""


def allowed_actions(instances: Iterable[TaskInstance], user: User) -> dict[int, list[str]]:
    """The actions `user` may take on each of `instances` now, by primary key, in the registry's
    order: none without the permission. One query, whatever the number of instances."""
    if not may_act(user):
        return {}
    instances = list(instances)
    failed = set(
        _user_failures().filter(task_instance_id__in=[ti.pk for ti in instances]).values_list("task_instance_id", flat=True)
    )
    return {ti.pk: [a for a in TASK_ACTIONS if not refusal(a, ti, user_failed=ti.pk in failed)] for ti in instances}


def allowed_by_state(run: DagRun, task_id: str, user: User) -> dict[str, list[str]]:
    """A mapped task's instances: the actions `user` may take on an instance in each state now,
    by state, as `refusal()` decides (reclassify only in the states where an instance has a
    user-charged failure). Two queries, whatever the number of instances."""
    if not may_act(user):
        return {}
    instances = TaskInstance.objects.filter(dag_run=run, task_id=task_id, map_index__gte=0)
    states = set(instances.values_list("state", flat=True).distinct())
    user_failed = set(
        _user_failures().filter(task_instance__in=instances).values_list("task_instance__state", flat=True).distinct()
    )
    return {
        state: [a for a in TASK_ACTIONS if not refusal(a, TaskInstance(task_id=task_id, state=state), user_failed=state in user_failed)]
        for state in states
    }


def _refuse_unless_allowed(action: str, ti: TaskInstance, *, user_failed: bool = False) -> None:
    if why := refusal(action, ti, user_failed=user_failed):
        raise Conflict(why)


def _user_failures() -> QuerySet[TaskAttempt]:
    """Attempts whose failure was charged to the task's own budget: what reclassify moves."""
    return TaskAttempt.objects.filter(kind=AttemptKind.USER, state=TaskAttempt.State.FAILED)


# --- actions ------------------------------------------------------------------------------------


def set_paused(dag: Dag, user: User, *, paused: bool) -> AuditLog | None:
    """Pause (no new scheduled runs, no new task dispatches) or unpause a DAG.

    A conditional update: nothing happens, and None is returned, when it already is so.
    """
    if not Dag.objects.filter(pk=dag.pk, paused=not paused).update(paused=paused):
        return None
    dag.paused = paused
    before, after = ("active", "paused") if paused else ("paused", "active")
    return audit(user, "pause" if paused else "unpause", dag.dag_id, "", "", before, after, {})


def waits_for_unpause(dag: Dag) -> str | None:
    """What to tell whoever triggered a run of `dag` when the DAG is paused (None when not)."""
    return f"DAG '{dag.dag_id}' is paused: the run is queued and starts once the DAG is unpaused" if dag.paused else None


def trigger(
    dag: Dag, user: User, *, conf: Any = None, triggered_by: str | None = None, actor: str = "", logical_date: Any = None
) -> DagRun:
    """`trigger_known`'s run."""
    return trigger_known(dag, user, conf=conf, triggered_by=triggered_by, actor=actor, logical_date=logical_date).run


def trigger_known(
    dag: Dag, user: User, *, conf: Any = None, triggered_by: str | None = None, actor: str = "", logical_date: Any = None
) -> ManualRun:
    """Create a manual run with `conf` (a JSON object), at `logical_date` when given (ISO 8601
    text, naive in the DAG's timezone; else the trigger time), with its task instances when the
    trigger knows them all (`run_creation.ManualRun`). A paused DAG's run waits queued
    (`waits_for_unpause`). A conf that is not an object, or a logical date that is not ISO 8601:
    BadRequest naming it.

    `triggered_by` defaults to the user's name; the CLI passes no user, "cli", and as `actor`
    the operating-system user who ran it, the audit log's "who".
    """
    by = triggered_by if triggered_by is not None else username_of(user)

    def record(run: DagRun) -> None:  # in the run's transaction: no run without its entry
        details: dict[str, Any] = {"conf": conf or {}}
        if logical_date is not None:
            details["logical_date"] = run.logical_date.isoformat()
        if by != username_of(user):  # e.g. "cli": who asked, when no user did
            details["triggered_by"] = by
        audit(user, "trigger", dag.dag_id, run.run_id, "", "", run.state, details, username=actor)

    return trigger_manual_run(dag, conf=conf, triggered_by=by, logical_date=logical_date, record=record)


def record_edit(user: User, dag_id: str, action: str, details: dict[str, Any]) -> AuditLog:
    """An edit made outside these actions (a DAG or task saved in the admin), for the audit log."""
    return audit(user, action, dag_id, "", "", "", "", details)


def clear(ti: TaskInstance, user: User, *, include_downstream: bool = False, keep_task_state: bool = False, note: str = "") -> AuditLog:
    """Run a finished (or waiting-to-retry, or dead-lettered) task again.

    Allowed from success, failed, upstream_failed, skipped, removed, dead_letter and
    up_for_retry. The task goes to `none` with a fresh set of tries
    (`retries.policy.cleared_max_tries`), no pending retry, its poison
    streak, platform-retry flag and pre-execution allowance reset. Its downstream tasks that are `upstream_failed`
    (transitively) go back to `none` too, since their upstream is no longer failed; with
    `include_downstream`, every transitive downstream task that is finished, dead-lettered,
    waiting to retry or scheduled gets the same treatment as the task itself (one that a
    worker holds makes the whole action a Conflict), except that a mapped task expanding over
    this task's result (or a cleared downstream's) is made unexpanded again
    (`clearing.unexpand`), to expand over the new result. A finished run is reopened. Every task it
    clears has its task state emptied (and so a new idempotency key) unless `keep_task_state`.
    """
    _refuse_unless_allowed("clear", ti)
    return _clear([ti], user, include_downstream=include_downstream, keep_task_state=keep_task_state, note=note)[0]


def _clear(
    instances: list[TaskInstance], user: User, *, include_downstream: bool = False, keep_task_state: bool = False, note: str = ""
) -> list[AuditLog]:
    """`clear` of one task's instances (each allowed), in one transaction, each audited: the
    same few statements however many instances (set-based, `clearing.clear_many`)."""
    first = instances[0]
    now = shared_now()

    def context_of(ti: TaskInstance) -> dict[str, Any]:
        extra = {} if ti.task_id == first.task_id else {"cleared_with": first.task_id}
        return _user_context(Reason.MANUAL_CLEAR, user, note, ti.state, now, **extra)

    to_clear: list[TaskInstance] = []
    downstream: list[TaskInstance] = []
    if include_downstream:
        downstream = _downstream(first, _run_instances(first))
        busy = sorted({d.task_id for d in downstream if d.state in ACTIVE_TASK_STATES})
        if busy:
            raise Conflict(f"cannot clear downstream tasks a worker holds: {', '.join(busy)}")
        to_clear = [d for d in clearing.clearable(downstream) if d.state in CLEAR_DOWNSTREAM_FROM]
    with transaction.atomic():
        for waiting in [*instances, *to_clear]:
            waits.end_attempt(waiting, TaskState.NONE, context_of(waiting), now)
        changed = clearing.clear_with_sources([*instances, *to_clear], downstream, context_of)
        changed_ids = {ti.pk for ti in changed}
        waits.forget(changed_ids)  # a cleared task's next wait starts afresh
        touched = [
            {"task_id": other.task_id, "prior_state": other.state, "new_state": TaskState.NONE.value}
            for other in to_clear if other.pk in changed_ids
        ]
        cleared_tasks = {first.task_id, *(other.task_id for other in to_clear)}
        unexpanded = sorted({other.task_id for other in downstream if clearing.source_of(other) in cleared_tasks})
        touched += _reset_upstream_failed(first)
        if not keep_task_state:
            task_state_store.empty(changed_ids)
        _reopen_if_unfinished(first.dag_run)
        details = {"note": note, "include_downstream": include_downstream, "keep_task_state": keep_task_state}
        if unexpanded:
            details["unexpanded"] = unexpanded
        entries = audit_many(
            user, "clear", first.dag_run.dag.dag_id, first.dag_run.run_id, first.task_id,
            # The downstream tasks are reset once, for all: the first entry names them.
            [(ti.state, TaskState.NONE, _instance_details(ti, {**details, "downstream": touched if at == 0 else []}))
             for at, ti in enumerate(instances)],
        )
    advance_run_now(first.dag_run_id)
    return entries


def mark_success(ti: TaskInstance, user: User, *, note: str = "") -> AuditLog:
    """Set the task to `success` as if it had succeeded.

    Allowed from failed, up_for_retry, dead_letter, upstream_failed, none, scheduled and
    skipped. Its downstream tasks that are `upstream_failed` (transitively) go back to `none`
    so that they run, and a failed run is reopened.
    """
    _refuse_unless_allowed("mark_success", ti)
    return _mark_success([ti], user, note=note)[0]


def _mark_success(instances: list[TaskInstance], user: User, *, note: str = "") -> list[AuditLog]:
    """`mark_success` of one task's instances (each allowed), in one transaction, each audited."""
    first = instances[0]
    now = shared_now()
    with transaction.atomic():
        _finish_many(instances, TaskState.SUCCESS, lambda ti: _user_context(Reason.MANUAL_MARK_SUCCESS, user, note, ti.state, now), now)
        touched = _reset_upstream_failed(first)
        _reopen_if_unfinished(first.dag_run)
        entries = audit_many(
            user, "mark_success", first.dag_run.dag.dag_id, first.dag_run.run_id, first.task_id,
            [(ti.state, TaskState.SUCCESS, _instance_details(ti, {"note": note, "downstream": touched if at == 0 else []}))
             for at, ti in enumerate(instances)],
        )
    advance_run_now(first.dag_run_id)
    return entries


def mark_failed(ti: TaskInstance, user: User, *, note: str = "") -> AuditLog:
    """Set the task to `failed` without retrying it; a queued or running task is stopped.

    Allowed from success, up_for_retry, dead_letter, upstream_failed, none, scheduled and
    skipped, and from queued and running: the task is taken from its worker (fenced by state
    and attempt token, so a report that wins the race makes this a Conflict), its attempt
    row ends `failed` with the same `user_action/manual_mark_failed` context, and the
    worker, whose next heartbeat is refused, kills the task's process group and passes that
    context (read from `last_failure_context`) to `on_kill`. Downstream tasks still waiting
    get `upstream_failed` from the run's next settling (`advance_run`), per their trigger
    rules; a succeeded run is reopened so that it ends `failed`.
    """
    _refuse_unless_allowed("mark_failed", ti)
    return _mark_failed([ti], user, note=note)[0]


def _mark_failed(instances: list[TaskInstance], user: User, *, note: str = "") -> list[AuditLog]:
    """`mark_failed` of one task's instances (each allowed), in one transaction, each audited."""
    first = instances[0]
    now = shared_now()
    stopping = {ti.pk for ti in instances if ti.state in ACTIVE_TASK_STATES}

    def context_of(ti: TaskInstance) -> dict[str, Any]:
        return _user_context(Reason.MANUAL_MARK_FAILED, user, note, ti.state, now, **({"stop": True} if ti.pk in stopping else {}))

    with transaction.atomic():
        _finish_many(instances, TaskState.FAILED, context_of, now)
        _stop_attempts([ti for ti in instances if ti.pk in stopping], context_of, now)
        _reopen_if_unfinished(first.dag_run)
        entries = audit_many(
            user, "mark_failed", first.dag_run.dag.dag_id, first.dag_run.run_id, first.task_id,
            [(ti.state, TaskState.FAILED, _instance_details(
                ti, {"note": note, "stopped": ti.pk in stopping, "worker_name": ti.worker_name if ti.pk in stopping else ""}
            )) for ti in instances],
        )
    advance_run_now(first.dag_run_id)
    return entries


def _stop_attempts(stopped: list[TaskInstance], context_of: Callable[[TaskInstance], dict[str, Any]], now: datetime) -> None:
    """The running attempts of the tasks `mark_failed` took from their workers end `failed` with
    the task's context (one statement per context), and are counted as failures."""
    by_context: dict[str, tuple[dict[str, Any], list[TaskInstance]]] = {}
    for ti in stopped:
        context = context_of(ti)
        by_context.setdefault(json.dumps(context, sort_keys=True, default=str), (context, []))[1].append(ti)
    ended: list[int] = []
    for context, group in by_context.values():
        tokens = {ti.pk: ti.attempt_token for ti in group}
        attempts = [
            pk for pk, ti_pk, token in TaskAttempt.objects.filter(
                task_instance_id__in=list(tokens), state__in=[TaskAttempt.State.QUEUED, TaskAttempt.State.RUNNING]
            ).values_list("pk", "task_instance_id", "attempt_token")
            if tokens[ti_pk] == token
        ]
        TaskAttempt.objects.filter(pk__in=attempts).update(state=TaskAttempt.State.FAILED, end_date=now, context=context)
        ended += attempts
    failure_counts.count_attempts(ended)


def reclassify(ti: TaskInstance, user: User, *, note: str = "") -> AuditLog:
    """Say that the task's last user-charged failure was really the platform's.

    The latest attempt of kind `user` in state `failed` becomes kind `platform` with context
    `infrastructure/operator_reclassified` (source `api`); its original context, its
    fingerprint, the note and the user are kept in that context's metadata, and the attempt
    loses its fingerprint (only application failures have one). The task gets its retry
    back the way a platform retry works: its next dispatch repeats that try, and the
    platform budget is charged instead
    (see `retries.policy.reclassified`). A task that is `failed` or `dead_letter` goes to
    `scheduled`; its `upstream_failed` downstream tasks go back to `none` and a finished run is
    reopened. The task's `last_failure_context` becomes `user_action/manual_reclassify`.
    No user-charged failed attempt, or a task a worker holds: Conflict.
    """
    attempt = _user_failures().filter(task_instance=ti).order_by("-attempt_token").first()
    why = refusal("reclassify", ti, user_failed=attempt is not None)
    if why or attempt is None:
        raise Conflict(why)
    now = shared_now()
    attempt_context = ExecutionContext.of(
        Reason.OPERATOR_RECLASSIFIED,
        Source.API,
        original_context=attempt.context,
        original_fingerprint=attempt.fingerprint,
        note=note,
        user=username_of(user),
    )
    given_back = reclassified(
        TaskState(ti.state),
        budget_of(ti),
        attempt_try_number=attempt.try_number,
        attempt_fingerprint=attempt.fingerprint,
    )
    new_state = given_back.next_state
    changes: dict[str, Any] = {
        "infrastructure_try_number": given_back.infrastructure_try_number,
        "fingerprint_streak": given_back.fingerprint_streak,
        "retry_is_platform": given_back.repeat_try,
        "last_failure_context": _user_context(Reason.MANUAL_RECLASSIFY, user, note, ti.state, now, attempt_try_number=attempt.try_number),
    }
    if new_state != ti.state:
        changes.update(state=new_state, next_retry_at=None, end_date=None)
    with transaction.atomic():
        if not transition(ti.pk, expected=[ti.state], token=ti.attempt_token, **changes):
            raise clearing.changed_meanwhile(ti)
        failure_counts.count(ti.pk, attempt.attempt_token, -1)  # counted again below under its new context
        moved = TaskAttempt.objects.filter(pk=attempt.pk, kind=AttemptKind.USER, state=TaskAttempt.State.FAILED).update(
            kind=AttemptKind.PLATFORM, context=attempt_context.to_dict(), fingerprint=None
        )
        if not moved:
            raise Conflict(f"the failed attempt of task '{ti.task_id}' changed meanwhile; reload and try again")
        failure_counts.count(ti.pk, attempt.attempt_token)
        touched = _reset_upstream_failed(ti) if new_state == TaskState.SCHEDULED else []
        _reopen_if_unfinished(ti.dag_run)
        entry = audit(
            user, "reclassify", ti.dag_run.dag.dag_id, ti.dag_run.run_id, ti.task_id, ti.state, new_state,
            _instance_details(ti, {
                "note": note,
                "attempt_try_number": attempt.try_number,
                "attempt_infrastructure_try_number": attempt.infrastructure_try_number,
                "original_context": attempt.context,
                "downstream": touched,
            }),
        )
    metrics.increment(
        metrics.INFRASTRUCTURE_RETRIES,
        dag_id=ti.dag_run.dag.dag_id,
        task_id=ti.task_id,
        reason=Reason.OPERATOR_RECLASSIFIED.value,
    )
    original = attempt.context or {}
    metrics.increment(
        metrics.RECLASSIFICATIONS,
        dag_id=ti.dag_run.dag.dag_id,
        task_id=ti.task_id,
        from_category=str(original.get("category", "")),
        from_reason=str(original.get("reason", "")),
    )
    advance_run_now(ti.dag_run_id)
    return entry


def operate_circuit(circuit: Circuit, action: str, user: User, *, note: str = "") -> AuditLog:
    """An operator's open, close or probe of a circuit; audited with the prior and new state."""
    now = shared_now()
    who = username_of(user)
    prior = circuit.state
    with transaction.atomic():
        if action == "open":
            circuits.open_circuit(circuit, now, reason=f"opened by {who}")
        elif action == "close":
            circuits.close_circuit(circuit, now, reason=f"closed by {who}")
        elif action == "probe":
            circuits.half_open(circuit)
        else:
            raise ValueError(f"unknown circuit action {action!r}")
        circuit.refresh_from_db()
        return audit(user, f"circuit_{action}", "", "", "", prior, circuit.state, {"circuit": circuit.name, "note": note})


# The function that does each registered task action on one instance.
IMPLEMENTATIONS: dict[str, Callable[..., AuditLog]] = {
    "clear": clear,
    "mark_success": mark_success,
    "mark_failed": mark_failed,
    "reclassify": reclassify,
}
# Clear and the marks on many instances of one task at once (each allowed by `refusal`).
BULK_ACTIONS: dict[str, Callable[..., list[AuditLog]]] = {
    "clear": _clear,
    "mark_success": _mark_success,
    "mark_failed": _mark_failed,
}


# --- bulk actions -------------------------------------------------------------------------------


def act_on_many(action: str, instances: Iterable[TaskInstance], user: User, *, note: str = "", **options: Any) -> tuple[list[str], list[str]]:
    """Apply one task action to each instance (each audited on its own).

    Returns the task instances done and the errors ("dag/run/task: why") of those refused,
    so that one task a worker took meanwhile does not stop the rest.
    """
    done, errors = [], []
    for ti in instances:
        where = f"{ti.dag_run.dag.dag_id}/{ti.dag_run.run_id}/{ti.label}"
        try:
            IMPLEMENTATIONS[action](ti, user, note=note, **options)
        except ActionError as exc:
            errors.append(f"{where}: {exc}")
        else:
            done.append(where)
    return done, errors


def failed_in_run(run: DagRun) -> list[TaskInstance]:
    """The run's failed tasks, for "clear all failed" (upstream_failed ones follow by themselves)."""
    return list(
        TaskInstance.objects.select_related("dag_run", "dag_run__dag", "definition")
        .filter(dag_run=run, state=TaskState.FAILED)
        .order_by("id")
    )


# --- helpers ------------------------------------------------------------------------------------


def _instance_details(ti: TaskInstance, details: dict[str, Any]) -> dict[str, Any]:
    """An audit entry names the instance of a mapped task it acted on."""
    return {**details, "map_index": ti.map_index} if ti.map_index >= 0 else details


def _finish_many(
    instances: list[TaskInstance], state: TaskState, context_of: Callable[[TaskInstance], dict[str, Any]], now: datetime
) -> None:
    """The instances to `state` by an operator, one fenced statement per context; Conflict when
    one changed since it was read (call in a transaction: then nothing of it stays)."""
    # A task marked failed has no result; one marked success keeps what it had (usually none).
    extra: dict[str, Any] = {"result": None} if state == TaskState.FAILED else {}
    by_context: dict[str, tuple[dict[str, Any], list[TaskInstance]]] = {}
    for ti in instances:
        context = context_of(ti)
        by_context.setdefault(json.dumps(context, sort_keys=True, default=str), (context, []))[1].append(ti)
    for context, group in by_context.values():
        won = transition_many(
            [(ti.pk, ti.attempt_token, ti.state) for ti in group],
            state=state,
            end_date=now,
            next_retry_at=None,
            retry_is_platform=False,
            last_failure_context=context,
            **extra,
        )
        lost = [ti for ti in group if ti.pk not in won]
        if lost:
            raise clearing.changed_meanwhile(lost[0])
    for ti in instances:
        waits.end_attempt(ti, state, context_of(ti), now)  # a waiting task's wait ends with the mark
    lifecycle.tasks_finished([ti.pk for ti in instances], now)


def _reset_upstream_failed(ti: TaskInstance) -> list[dict[str, str]]:
    """Put transitive downstream tasks that are upstream_failed back to none, to be settled again."""
    reset = [other for other in _downstream(ti, _run_instances(ti)) if other.state == TaskState.UPSTREAM_FAILED]
    if not reset:
        return []
    won = transition_many([(other.pk, other.attempt_token, other.state) for other in reset], state=TaskState.NONE, end_date=None)
    lost = [other for other in reset if other.pk not in won]
    if lost:
        raise clearing.changed_meanwhile(lost[0])
    return [{"task_id": other.task_id, "prior_state": other.state, "new_state": TaskState.NONE.value} for other in reset]


def downstream_of(ti: TaskInstance) -> list[TaskInstance]:
    """Every task of `ti`'s run downstream of it, directly or not (what an action may touch)."""
    return _downstream(ti, _run_instances(ti))


def _run_instances(ti: TaskInstance) -> list[TaskInstance]:
    return list(
        TaskInstance.objects.select_related("dag_run", "dag_run__dag", "definition").filter(dag_run_id=ti.dag_run_id)
    )


def _downstream(ti: TaskInstance, instances: list[TaskInstance]) -> list[TaskInstance]:
    """Every task of the run downstream of `ti`, directly or not, in run order."""
    children: dict[str, set[str]] = {}
    for other in instances:
        for parent in other.definition.upstream if other.definition else []:
            children.setdefault(parent, set()).add(other.task_id)
    seen: set[str] = set()
    stack = [ti.task_id]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in seen and child != ti.task_id:
                seen.add(child)
                stack.append(child)
    return [other for other in instances if other.task_id in seen]


def _reopen_if_unfinished(run: DagRun) -> None:
    """A finished run whose tasks now call for another outcome goes back to running.

    The condition on the run's state makes this safe against a scheduler finishing it at the
    same time; `advance_run()` then ends it again with the right state when that is due.
    """
    states = TaskInstance.objects.filter(dag_run_id=run.pk).values_list("state", flat=True)
    outcome = run_outcome(states)
    DagRun.objects.filter(pk=run.pk, state__in=FINISHED_RUN_STATES).exclude(state=outcome or "").update(
        state=RunState.RUNNING, end_date=None
    )


def _user_context(
    reason: Reason, user: User, note: str, prior_state: str, now: datetime, **extra: Any
) -> dict[str, Any]:
    context = ExecutionContext.of(reason, Source.API, user=username_of(user), note=note, prior_state=str(prior_state), **extra)
    return {**context.to_dict(), "at": now.isoformat()}
