"""The scheduler pass: create due runs, move runs on, find what no worker can report.

`schedule_once(now)` is one pass; the run_scheduler command is a small loop around it.
Several schedulers may run at once: every change is a conditional update, and on PostgreSQL
runs are claimed with SELECT ... FOR UPDATE SKIP LOCKED so two schedulers split the work.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import cast

import redis
from django.conf import settings
from django.db import (
    IntegrityError,
    InterfaceError,
    OperationalError,
    connection,
    transaction,
)
from django.db.models import Exists, OuterRef, Q, QuerySet
from rq import Queue
from rq.registry import FailedJobRegistry
from rq.utils import str_to_date

from orchestrator.data import sql
from orchestrator.engine import backfill_runs, circuits, enqueuing, leases, retention, schedules, waits
from orchestrator.engine.reporting import report_failure
from orchestrator.engine.rules import Readiness, readiness
from orchestrator.engine.run_advance import advance_run
from orchestrator.engine.run_creation import create_run
from orchestrator.engine.run_reads import FEW_UPSTREAMS, UNFINISHED, UNFINISHED_PROBE, active_runs
from orchestrator.engine.run_rules import may_create_scheduled_run, not_held_by_pause
from orchestrator.foundation.clock import db_now, shared_now
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.foundation.run_params import ParamError, fill_defaults, resolve_conf
from orchestrator.models import Dag, DagRun, TaskInstance, job_id_for
from retries.context import ExecutionContext
from retries.states import (
    FAILED_TASK_STATES,
    WAITING_TO_RUN_STATES,
    PreExecutionReason,
    Reason,
    RunState,
    Source,
    TaskState,
    TriggerRule,
)

log = logging.getLogger(__name__)


@dataclass
class PassReport:
    runs_created: int = 0
    tasks_dispatched: int = 0
    runs_finished: int = 0
    lost: list[str] = field(default_factory=list)


def schedule_once(now: datetime | None = None) -> PassReport:
    """One scheduler pass. Each step handles its own items and never stops the others."""
    now = now or shared_now()
    report = PassReport()
    for step in (
        _create_due_runs,
        _start_backfill_runs,
        _evaluate_circuits,
        _advance_unfinished_runs,
        _check_waits,
        _find_lost_tasks,
        _clean_history,
    ):
        try:
            # A step whose transaction met a plan a migration made stale runs once more.
            sql.once_more_if_stale(step, now, report)
        except (OperationalError, InterfaceError):
            log.warning("scheduler step %s: the database is unreachable; trying again next pass", step.__name__)
            _Reconnection.note_outage()
            connection.close()
        except Exception:
            log.exception("scheduler step %s failed; continuing", step.__name__)
    return report


# --- runs ------------------------------------------------------------------------------------


def _create_due_runs(now: datetime, report: PassReport) -> None:
    # Only DAGs whose next run is due or not yet computed (index dag_next_run_due), not every
    # scheduled DAG on every pass.
    dags = (
        Dag.objects.filter(paused=False)
        .filter(Q(next_run_logical_date__isnull=True) | Q(next_run_logical_date__lte=now))
        .exclude(schedule__isnull=True)
        .exclude(schedule="")
    )
    for dag in dags:
        if create_due_run(dag, now):
            report.runs_created += 1


def create_due_run(dag: Dag, now: datetime) -> DagRun | None:
    """Create the DAG's next scheduled run if its time has come."""
    schedule = dag.schedule
    if not schedule:
        return None  # manual only
    if dag.next_run_logical_date is None:
        first = schedules.first_run_date(schedule, dag.timezone, dag.start_date, dag.catchup, now)
        Dag.objects.filter(pk=dag.pk, next_run_logical_date__isnull=True).update(next_run_logical_date=first)
        dag.refresh_from_db(fields=["next_run_logical_date"])
    due = dag.next_run_logical_date
    if due is None or due > now:
        return None
    if not dag.catchup:
        due = schedules.latest_due(schedule, dag.timezone, due, now)
    if not may_create_scheduled_run(dag.max_active_runs, active_runs(dag.pk)):
        return None
    following = schedules.next_after(schedule, dag.timezone, due)
    # Only the scheduler that moves the bookmark creates the run.
    with transaction.atomic():
        moved = Dag.objects.filter(pk=dag.pk, next_run_logical_date=dag.next_run_logical_date).update(
            next_run_logical_date=following
        )
        if not moved:
            return None
        try:
            with transaction.atomic():
                return create_run(dag, run_type=DagRun.RunType.SCHEDULED, logical_date=due, conf=scheduled_conf(dag), now=now)
        except IntegrityError:
            return None


def scheduled_conf(dag: Dag) -> dict:
    """A scheduled run's conf: the DAG's params at their defaults. A DAG with a schedule has a
    default for every param (its import, or the admin, refuses it otherwise); one that lacks
    some anyway still gets its run, with the defaults it has, and the problem is logged."""
    try:
        return resolve_conf(dag.params, dag.strict_params, {})
    except ParamError as exc:
        log.error("dag %s: its scheduled run lacks a param: %s", dag.dag_id, exc)
        return fill_defaults(dag.params, {})


def _start_backfill_runs(now: datetime, report: PassReport) -> None:
    report.runs_created += backfill_runs.start_runs(now)


def _evaluate_circuits(now: datetime, report: PassReport) -> None:
    # Cool-downs end with time, not with a report: someone must look.
    circuits.evaluate_all(now)


def _advance_unfinished_runs(now: datetime, report: PassReport) -> None:
    needing = runs_needing_work(now)
    busy = _being_dispatched(needing)
    for run_id in [run_id for run_id in needing if run_id not in busy]:
        try:
            dispatched, finished = advance_run(run_id, now, skip_locked=True)
        except Exception:
            log.exception("could not advance run %s", run_id)
            continue
        report.tasks_dispatched += dispatched
        report.runs_finished += int(finished)


def _check_waits(now: datetime, report: PassReport) -> None:
    # Due waits in a batch; an HTTP check runs on a thread of its own and is collected later.
    checked = waits.check_due(now)
    report.tasks_dispatched += checked.released


def _being_dispatched(run_ids: list[int]) -> set[int]:
    """The runs whose due tasks a dispatcher is still putting on their way, chunk by chunk
    (`enqueuing`): left to it. Without Redis, none: the fences keep a race safe."""
    try:
        return enqueuing.being_dispatched(get_redis(), run_ids)
    except Exception:
        log.warning("could not read which runs are being dispatched", exc_info=True)
        return set()


def runs_needing_work(now: datetime) -> list[int]:
    """Unfinished runs that a locked advance_run() would change, found without locking any.

    Most runs on most passes wait for their workers; locking each of them just to find
    that out made an idle pass cost milliseconds per run. Indexed queries name the runs that
    could have work: queued, none of their tasks unfinished (to end), or a task waiting to be
    settled or dispatched. Of those only the waiting tasks are read, and the states of the
    upstreams of the ones waiting for them (`_settleable`). advance_run() re-checks everything
    under its lock, so a stale read here only delays work by one pass.
    """
    needing = set(DagRun.objects.filter(not_held_by_pause(), state=RunState.QUEUED).values_list("pk", flat=True))
    running = DagRun.objects.filter(not_held_by_pause(), state=RunState.RUNNING)
    waiting = TaskInstance.objects.filter(dag_run=OuterRef("pk"), state__in=[str(s) for s in WAITING_STATES])
    unfinished = TaskInstance.objects.filter(dag_run=OuterRef("pk"), state__in=UNFINISHED)
    needing |= set(running.filter(~Exists(unfinished)).values_list("pk", flat=True))  # every task done: to end
    candidates = set(running.filter(Exists(waiting)).values_list("pk", flat=True)) - needing
    if not candidates:
        return sorted(needing)
    rows = (
        TaskInstance.objects.filter(dag_run_id__in=candidates, state__in=[str(s) for s in WAITING_STATES])
        .order_by()
        .values_list("dag_run_id", "state", "next_retry_at", "definition_id", "definition__upstream", "definition__trigger_rule")
    )
    to_settle: dict[int, list[tuple[list[str], str]]] = {}  # run -> its tasks waiting for their upstreams
    for run_id, state, next_retry_at, definition_id, upstream, trigger_rule in rows:
        if run_id in needing:
            continue
        if definition_id is None or (state != TaskState.NONE and (next_retry_at is None or next_retry_at <= now)):
            needing.add(run_id)  # due, or removed from its DAG: to be dispatched, or removed
        elif state == TaskState.NONE:
            to_settle.setdefault(run_id, []).append((list(upstream or []), trigger_rule))
    needing |= _settleable({run_id: tasks for run_id, tasks in to_settle.items() if run_id not in needing})
    return sorted(needing)


# Task states that may let advance_run() do something: settle it, or dispatch it.
WAITING_STATES = frozenset({TaskState.NONE}) | WAITING_TO_RUN_STATES
# Trigger rules that wait while an upstream is unfinished, unless an upstream failed.
_WAIT_WHILE_OPEN = frozenset({TriggerRule.ALL_SUCCESS, TriggerRule.NONE_FAILED, TriggerRule.ONE_FAILED})


def _settleable(to_settle: dict[int, list[tuple[list[str], str]]]) -> set[int]:
    """The runs in which one of these waiting tasks (upstream, trigger rule) may be settled now.

    The upstreams' states are read in one query for all the runs. A wide fan-in is first
    checked against two bounded reads of its run (`_fan_ins_wait`), so the pass does not read
    a 10,000-task run's every row each second while its sink waits for them."""
    to_read: dict[int, list[tuple[list[str], str]]] = {}
    for run_id, tasks in to_settle.items():
        wide = [task for task in tasks if len(task[0]) > FEW_UPSTREAMS]
        if wide and _fan_ins_wait(run_id, wide):
            tasks = [task for task in tasks if len(task[0]) <= FEW_UPSTREAMS]
        if tasks:
            to_read[run_id] = tasks
    states = _upstream_states({run_id: {name for upstream, _ in tasks for name in upstream} for run_id, tasks in to_read.items()})
    return {
        run_id
        for run_id, tasks in to_read.items()
        if any(
            readiness(rule, [state for name in upstream for state in states.get((run_id, name), [TaskState.REMOVED])])
            is not Readiness.WAIT
            for upstream, rule in tasks
        )
    }


def _fan_ins_wait(run_id: int, tasks: list[tuple[list[str], str]]) -> bool:
    """Whether each of these tasks of the run must wait, told by its failed tasks and its first
    unfinished ones: a task whose rule waits while an upstream is open waits while one is seen
    open and (unless the rule is all_done) none failed. False: not known so, read the states."""
    if any(rule not in _WAIT_WHILE_OPEN and rule != TriggerRule.ALL_DONE for _, rule in tasks):
        return False
    failed = set(TaskInstance.objects.filter(dag_run_id=run_id, state__in=FAILED).values_list("task_id", flat=True))
    open_tasks = set(
        TaskInstance.objects.filter(dag_run_id=run_id, state__in=UNFINISHED)
        .order_by("task_id")  # as its index is (run_reads.UNFINISHED): read up to the limit, no further
        .values_list("task_id", flat=True)[:UNFINISHED_PROBE]
    )
    for upstream, rule in tasks:
        names = set(upstream)
        if (rule != TriggerRule.ALL_DONE and failed & names) or not open_tasks & names:
            return False
    return True


def _upstream_states(names_by_run: dict[int, set[str]]) -> dict[tuple[int, str], list[str]]:
    """The states of these tasks' instances in their runs, each once (a mapped task has several)."""
    states: dict[tuple[int, str], list[str]] = {}
    names = sorted(set().union(*names_by_run.values()))
    for start in range(0, len(names), NAMES_PER_QUERY):
        rows = (
            TaskInstance.objects.filter(dag_run_id__in=list(names_by_run), task_id__in=names[start : start + NAMES_PER_QUERY])
            .order_by()
            .values_list("dag_run_id", "task_id", "state")
            .distinct()
        )
        for run_id, task_id, state in rows:
            states.setdefault((run_id, task_id), []).append(state)
    return states


# Task names per query of their states (SQLite allows 32,766 parameters per statement).
NAMES_PER_QUERY = 5000
FAILED = sorted(str(state) for state in FAILED_TASK_STATES)


# --- history ---------------------------------------------------------------------------------

# With ORCHESTRATOR_RETENTION_DAYS set, a pass deletes old history for at most this many small
# transactions, once a minute: the clean-up never delays the work of a pass by much.
CLEAN_TRANSACTIONS_PER_PASS = 5
CLEAN_EVERY = 60.0


class _Cleaning:
    next_at = 0.0  # time.monotonic() of the next clean-up step in this scheduler
    # Runs that could not be deleted: skipped (named once, in a warning) while this scheduler lives.
    undeletable: set[int] = set()


def _clean_history(now: datetime, report: PassReport) -> None:
    days = float(settings.ORCHESTRATOR_RETENTION_DAYS)
    if days <= 0 or time.monotonic() < _Cleaning.next_at:
        return
    keep_failed = float(settings.ORCHESTRATOR_RETENTION_KEEP_FAILED_DAYS) or None
    done = retention.clean(
        *retention.cutoffs(now, days, keep_failed), max_transactions=CLEAN_TRANSACTIONS_PER_PASS, skipped=_Cleaning.undeletable
    )
    if done.transactions < CLEAN_TRANSACTIONS_PER_PASS:
        _Cleaning.next_at = time.monotonic() + CLEAN_EVERY  # nothing left for now
    if done.runs or done.task_instances:
        log.info("retention: deleted %d runs, %d task instances, %d attempts", done.runs, done.task_instances, done.attempts)


# --- what no worker can report ------------------------------------------------------------------


class _Reconnection:
    """Whether a scheduler lost the database lately. Workers get one heartbeat timeout after it
    is back before anything is presumed lost: their heartbeats could not get through either.

    Kept in Redis, not in this process: a scheduler restarted during or after the outage (or
    another scheduler) still waits. The outage is noted (`OUTAGE_KEY`); the first pass that
    reaches the database again turns it into a time before which no task is presumed lost
    (`PRESUME_FROM_KEY`, the database's time). If Redis cannot be read, nothing is presumed lost.
    """

    OUTAGE_KEY = "orchestrator:scheduler:db_outage"
    PRESUME_FROM_KEY = "orchestrator:scheduler:presume_lost_from"

    @classmethod
    def note_outage(cls) -> None:
        try:
            get_redis().set(cls.OUTAGE_KEY, "1")
        except redis.RedisError:
            log.warning("could not note the database outage in Redis", exc_info=True)

    @classmethod
    def may_presume_lost(cls, db_time: datetime) -> bool:
        client = get_redis()
        timeout = float(settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT)
        if client.get(cls.OUTAGE_KEY) is not None:
            hold_until = db_time + timedelta(seconds=timeout)
            # Kept a little longer than the wait itself; a stale value only says "wait until then".
            client.set(cls.PRESUME_FROM_KEY, hold_until.isoformat(), ex=max(1, int(timeout * 2) + 1))
            client.delete(cls.OUTAGE_KEY)
            return False
        raw = cast("bytes | str | None", client.get(cls.PRESUME_FROM_KEY))  # redis-py types a reply as maybe-awaitable, for its async client too
        if raw is None:
            return True
        return db_time >= datetime.fromisoformat(raw.decode() if isinstance(raw, bytes) else raw)


def _silent(candidates: list[TaskInstance]) -> list[TaskInstance]:
    """The candidates whose worker holds no lease in Redis either: only those may be lost.

    A worker cut off from the database keeps its attempts' leases in Redis; when Redis cannot
    be read, nothing is presumed lost this pass (the next one looks again)."""
    if not candidates:
        return []
    alive = leases.held(get_redis(), [(ti.pk, ti.attempt_token) for ti in candidates])
    return [ti for ti in candidates if (ti.pk, ti.attempt_token) not in alive]


def _lost_outcomes(stale: list[TaskInstance]) -> dict[tuple[int, int], str]:
    """Why their workers lost these attempts' outcomes, where a worker said so."""
    try:
        return leases.lost_notes(get_redis(), [(ti.pk, ti.attempt_token) for ti in stale])
    except redis.RedisError:
        return {}


def _find_lost_tasks(now: datetime, report: PassReport) -> None:
    db_time = db_now()
    try:
        if not _Reconnection.may_presume_lost(db_time):
            return
    except redis.RedisError:
        log.warning("cannot read the last database outage from Redis; presuming no task lost this pass")
        return
    heartbeat_cutoff = db_time - timedelta(seconds=float(settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT))
    # By id: the model's ordering (its run's queued_at) would join every run, finished ones too.
    stale_running = list(TaskInstance.objects.filter(state=TaskState.RUNNING, heartbeat_at__lt=heartbeat_cutoff).order_by("id"))
    stale_claimed = list(TaskInstance.objects.filter(state=TaskState.QUEUED, heartbeat_at__lt=heartbeat_cutoff).order_by("id"))
    try:
        stale_running, stale_claimed = _silent(stale_running), _silent(stale_claimed)
    except redis.RedisError:
        log.warning("cannot read attempt leases from Redis; presuming no task lost this pass")
        return
    # Running with a stale heartbeat: the worker or its machine died, or (noted in Redis) its
    # worker could neither deliver nor spool the outcome and let the lease go.
    lost_outcomes = _lost_outcomes(stale_running)
    for ti in stale_running:
        why = lost_outcomes.get((ti.pk, ti.attempt_token))
        context = ExecutionContext.of(
            Reason.WORKER_LOST,
            Source.SCHEDULER,
            worker_name=ti.worker_name,
            hostname=ti.hostname,
            pid=ti.pid,
            last_heartbeat=ti.heartbeat_at.isoformat() if ti.heartbeat_at else None,
            **({"outcome_lost": why} if why else {}),
        )
        if report_failure(ti.pk, ti.attempt_token, context, expected=frozenset({TaskState.RUNNING}), now=now):
            report.lost.append(f"{ti.pk}:worker_lost")
    # Queued, taken by a worker that stopped heartbeating before the task reported running.
    for ti in stale_claimed:
        context = ExecutionContext.of(
            Reason.PRE_EXECUTION_FAILURE,
            Source.SCHEDULER,
            pre_execution_reason=PreExecutionReason.WORKER_DIED.value,
            worker_name=ti.worker_name,
            hostname=ti.hostname,
        )
        if report_failure(ti.pk, ti.attempt_token, context, expected=frozenset({TaskState.QUEUED}), now=now):
            report.lost.append(f"{ti.pk}:pre_execution_failure")
    _find_lost_jobs(now, db_time, report)


def _failed_in_rq(unclaimed: QuerySet[TaskInstance]) -> list[tuple[int, int, datetime | None, str]]:
    """The unclaimed task instances (id, token, queued_at, queue) whose job RQ has failed.

    Read from RQ's failed registries, which hold few jobs (only those RQ itself failed, for a
    day: a task's own failure is reported to the database), not by asking about every waiting
    job (one read of those few, if any, by id): a backlog of
    10,000 jobs cost each pass a read of 10,000 rows and a ZMSCORE of 10,000 ids. A registry of
    more than FAILED_READ_LIMIT jobs is asked about its queue's waiting jobs instead."""
    client = get_redis()
    registries = [FailedJobRegistry(queue.name, connection=client) for queue in Queue.all(connection=client)]
    if not registries:
        return []
    pipe = client.pipeline(transaction=False)
    for registry in registries:
        pipe.zcard(registry.key)
    attempts: set[tuple[int, int]] = set()
    large: list[FailedJobRegistry] = []
    for registry, size in zip(registries, pipe.execute()):
        if size > FAILED_READ_LIMIT:
            large.append(registry)
        elif size:
            job_ids = cast("list[bytes]", client.zrange(registry.key, 0, -1))  # redis-py types a reply as maybe-awaitable
            attempts.update(attempt for attempt in map(_attempt_of, job_ids) if attempt is not None)
    fields = ("id", "attempt_token", "queued_at", "queue")
    failed = []
    if attempts:
        rows = unclaimed.filter(pk__in={pk for pk, _ in attempts}).order_by("id").values_list(*fields)
        failed = [row for row in rows if (row[0], row[1]) in attempts]
    for registry in large:
        waiting = list(unclaimed.filter(queue=registry.name).order_by("id").values_list(*fields))
        scores = cast("list[float | None]", client.zmscore(registry.key, [job_id_for(pk, token) for pk, token, _, _ in waiting]))
        failed += [row for row, score in zip(waiting, scores) if score is not None]
    return failed


# Failed jobs read from a queue's registry (more: the queue's waiting jobs are looked up in it).
FAILED_READ_LIMIT = 1000


def _attempt_of(job_id: bytes | str) -> tuple[int, int] | None:
    """The (task instance, token) of a job id `job_id_for` made; None for any other job."""
    text = job_id.decode() if isinstance(job_id, bytes) else job_id
    prefix, _, numbers = text.partition("-")
    pk, _, token = numbers.partition("-")
    if prefix != "ti" or not pk.isdigit() or not token.isdigit():
        return None
    return int(pk), int(token)


# How many overdue jobs one pass looks at (oldest first): a backlog of any length costs a pass
# the same; a lost job among thousands waiting is found a few passes later, never presumed.
LOST_JOB_CHECKS_PER_PASS = 200


def _find_lost_jobs(now: datetime, db_time: datetime, report: PassReport) -> None:
    """Queued and never claimed by a worker: is its job still on its way?

    - a job RQ failed is final at once (e.g. its worker could not reach the database to claim it);
    - after ORCHESTRATOR_QUEUED_TIMEOUT: a job that is gone (Redis restarted empty) is `queue_lost`;
      one still `queued` but out of its queue for a heartbeat timeout was taken by a worker that
      never started it (a stopped worker parked in its blocking pop): `queue_lost` too; one `started` by a worker whose RQ heartbeat
      of that job stopped before it claimed it (it died, or is stopped, between taking and
      claiming) is a pre-execution failure; one that ended some other way (finished, stopped,
      canceled) too. A job that waits its turn in its queue is never presumed lost, however long
      the backlog, and neither is one whose worker is alive but slow to claim it. A late claim of
      a presumed-lost job fails on its token.

    The work of a pass does not grow with the backlog: the size of each queue's failed registry
    (and the jobs in those that hold any), a read of at most LOST_JOB_CHECKS_PER_PASS overdue
    jobs, RQ's status of those, and one read of each of their queues (no per-job scan of a queue).
    """
    cutoff = db_time - timedelta(seconds=float(settings.ORCHESTRATOR_QUEUED_TIMEOUT))
    unclaimed = TaskInstance.objects.filter(state=TaskState.QUEUED, heartbeat_at__isnull=True)
    # The oldest overdue, by queued_at then id: never the model's ordering (its run's queued_at),
    # which would join every run, finished ones too.
    overdue = list(
        unclaimed.filter(queued_at__lt=cutoff)
        .order_by("queued_at", "id")
        .values_list("id", "attempt_token", "queued_at", "queue")[:LOST_JOB_CHECKS_PER_PASS]
    )
    suspects = _failed_in_rq(unclaimed)
    suspects += [w for w in overdue if w not in suspects]
    if not suspects:
        _Absent.forget_all_but(set())
        return
    job_ids = [job_id_for(pk, token) for pk, token, _, _ in suspects]
    in_queue = _in_their_queues({queue for _, _, _, queue in suspects})  # before the statuses: see _Absent
    details = _job_details(job_ids)
    on_their_way = enqueuing.on_their_way(
        get_redis(), [(queue, queued_at) for (_, _, queued_at, queue), (status, _) in zip(suspects, details) if status is None and queued_at]
    )
    absent_now: set[str] = set()
    heartbeat_cutoff = now - timedelta(seconds=float(settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT))
    for (pk, token, queued_at, queue), job_id, (status, last_heartbeat) in zip(suspects, job_ids, details):
        is_overdue = queued_at is not None and queued_at < cutoff
        if status in ("deferred", "scheduled") or (status in (None, "queued", "started") and not is_overdue):
            continue  # still on its way to a worker
        if status is None and (queue, queued_at) in on_their_way:
            continue  # its dispatcher is still putting its batch on Redis
        if status == "queued":
            if job_id in in_queue:
                continue  # waiting its turn
            absent_now.add(job_id)
            if not _Absent.long_enough(job_id):
                continue  # a worker may be between its pop and RQ's `started`: look again later
        if status == "started" and last_heartbeat is not None and last_heartbeat >= heartbeat_cutoff:
            continue  # its worker is alive and keeps the job: slow to claim it, not lost
        if status in (None, "queued"):
            context = ExecutionContext.of(Reason.QUEUE_LOST, Source.SCHEDULER, job_id=job_id, job_status=status)
        else:
            # The job ended before our code claimed it: RQ gave up on it, or the claim failed.
            context = ExecutionContext.of(
                Reason.PRE_EXECUTION_FAILURE,
                Source.SCHEDULER,
                pre_execution_reason=PreExecutionReason.WORKER_DIED.value,
                job_status=status,
            )
        if report_failure(pk, token, context, expected=frozenset({TaskState.QUEUED}), now=now):
            report.lost.append(f"{pk}:{context.reason}")
    _Absent.forget_all_but(absent_now)


class _Absent:
    """Jobs this scheduler saw `queued` yet out of their queue, and since when. RQ takes a job
    from its queue (to the queue's intermediate list, or with BLPOP to nowhere) a moment before
    it marks it `started`; a job seen so for a heartbeat timeout is not in that moment: its
    worker is stopped. Kept in memory: only this scheduler needs it, and one that restarts
    merely waits that long again."""

    since: dict[str, float] = {}

    @classmethod
    def long_enough(cls, job_id: str) -> bool:
        first = cls.since.setdefault(job_id, time.monotonic())
        return time.monotonic() - first >= float(settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT)

    @classmethod
    def forget_all_but(cls, job_ids: set[str]) -> None:
        cls.since = {job_id: at for job_id, at in cls.since.items() if job_id in job_ids}


def _in_their_queues(queues: set[str]) -> set[str]:
    """The job ids waiting in these queues: one read of each queue per pass, not one scan of a
    queue per job. A job a worker takes moves to that queue's intermediate list (or, with BLPOP,
    to no list) and is marked `started` a moment later: see _Absent."""
    if not queues:
        return set()
    pipe = get_redis().pipeline(transaction=False)
    for queue in sorted(queues):
        pipe.lrange(f"rq:queue:{queue}", 0, -1)
    return {job_id.decode() if isinstance(job_id, bytes) else job_id for ids in pipe.execute() for job_id in ids}


def _job_details(job_ids: list[str]) -> list[tuple[str | None, datetime | None]]:
    """RQ's status of each job and when its worker last said it holds it (None: not started)."""
    if not job_ids:
        return []
    pipe = get_redis().pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hmget(f"rq:job:{job_id}", ["status", "last_heartbeat"])
    details = []
    for status, heartbeat in pipe.execute():
        status = status.decode() if isinstance(status, bytes) else status
        details.append((status, str_to_date(heartbeat) if heartbeat else None))
    return details
