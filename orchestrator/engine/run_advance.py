"""Moving a run on: start it, settle its waiting tasks, dispatch the ready ones, end it.

Two ways in. `advance_run` moves the whole run (the scheduler's pass, a trigger, an operator
action); `advance_after_report` moves only what the end of one task can change (a worker's
report), at the same cost however wide the run. `advance_run_now` is either of them for a
caller whose own change is saved already: it never raises. Nothing here imports the scheduler.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import datetime

from django.db import connection, transaction

from deadlines import lifecycle
from orchestrator.data import sql
from orchestrator.engine import enqueuing, tablestats
from orchestrator.engine.admission import dispatch_ready
from orchestrator.engine.rules import run_outcome
from orchestrator.engine.run_reads import active_runs, first_without_upstream, instances_of, lock_dag, locked_run, outcome_counted
from orchestrator.engine.run_rules import ActiveRuns, held_by_pause, may_start_run
from orchestrator.engine.run_settling import Unwritten, is_due, settle_downstream_of, settle_whole_run
from orchestrator.foundation.clock import shared_now
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.listeners import notify
from orchestrator.models import DagRun, TaskAttempt, TaskInstance
from retries.states import RunState

log = logging.getLogger(__name__)

# What a run's tasks are due now, and its outcome (None: not over), after settling what can be:
# the step each way in takes between starting the run and dispatching.
Settling = Callable[[DagRun, datetime, Unwritten], tuple[list[TaskInstance], RunState | None]]


def advance_run(dag_run_id: int, now: datetime | None = None, *, skip_locked: bool = False) -> tuple[int, bool]:
    """Move the whole run on: every task of it is read and settled.

    Returns (tasks dispatched, whether the run finished). Safe to call from any process at
    any time: each change is conditional, so concurrent callers cannot double-dispatch. On
    PostgreSQL the run row is locked for the pass; schedulers skip a run another process
    holds (`skip_locked`)."""
    return _advance(dag_run_id, now or shared_now(), _whole_run, skip_locked=skip_locked)


def advance_after_report(
    dag_run_id: int, ended: str, now: datetime | None = None, *, ended_states: list[str] | None = None, savepoint: bool = True
) -> tuple[int, bool]:
    """Move the run on after task `ended` ended: only that task's downstream is settled and the
    rest of the run is counted in SQL, so a report costs the same however wide its run is. The
    run's row lock is waited for, so the downstream tasks are dispatched at once.

    `ended_states`, when the caller knows them, are the states of every instance of `ended`
    (a task that is not mapped has one): they are then not read again. Inside a caller's
    transaction it takes a savepoint unless `savepoint` is False (a report, which rolls back
    whole if this fails: `reporting._with_advance_or_alone`). Returns as `advance_run`."""
    settling = functools.partial(_downstream_of, ended=ended, ended_states=ended_states)
    return _advance(dag_run_id, now or shared_now(), settling, skip_locked=False, savepoint=savepoint)


class StartFailed(Exception):
    """A run created in this transaction could not be started (`start_created_run`): the
    transaction is to be rolled back."""


def start_created_run(run: DagRun, now: datetime, instances: list[TaskInstance] | None = None) -> None:
    """Start a run created in the current transaction, and dispatch its first tasks, before that
    transaction commits: one commit for a trigger instead of two. Nobody else sees the run before
    the commit, so it is not read again nor locked, nor are its task instances when the caller
    has them (`instances`, as `instances_of` reads them: left as the start leaves them).

    No savepoint of its own (two round trips): a start that fails raises StartFailed, and the
    caller rolls its transaction back and creates the run again without starting it, for the
    scheduler's next pass to start."""
    settling = _whole_run if instances is None else functools.partial(_whole_run, known=instances)
    try:
        _advance(run.pk, now, settling, skip_locked=False, savepoint=False, created=run)
    except Exception as exc:
        raise StartFailed(f"could not start run {run.pk}") from exc


def start_big_run(dag_run_id: int) -> None:
    """Start a big run once its creation is committed (and its table analyzed): its first tasks
    dispatched from a chunk's worth of rows (`_first_ready`), then the whole run moved on as any
    other, the rest of its ready tasks dispatched in chunks. The first tasks run while the rest
    are read. Never raises: what fails is left to the scheduler's next pass."""
    try:
        _advance(dag_run_id, shared_now(), _first_ready, skip_locked=False)
    except Exception:
        log.exception("could not start run %s; the next scheduler pass will", dag_run_id)
    advance_run_now(dag_run_id)


def advance_run_now(dag_run_id: int, *, ended: str | None = None) -> None:
    """Move a run on right after a report (`ended`: the task that ended) or an operator action,
    instead of at the next pass.

    The change that called it is already saved; if this fails, the scheduler's next pass does
    the same work, so the failure is logged and never raised into the caller.
    """
    try:
        if ended is None:
            advance_run(dag_run_id)
        else:
            advance_after_report(dag_run_id, ended)
    except Exception:
        log.exception("could not advance run %s; the next scheduler pass will", dag_run_id)


def _advance(
    dag_run_id: int, now: datetime, settling: Settling, *, skip_locked: bool, savepoint: bool = True, created: DagRun | None = None
) -> tuple[int, bool]:
    """Start the run, settle (`settling`), dispatch the due tasks, end the run if it is over.
    `created`: the run, created in the caller's transaction (not read again).

    The first FIRST_DISPATCH_CHUNK due tasks are dispatched in this transaction, the rest once it
    commits (`dispatch_later`), so a wide run's first jobs are on Redis before the rest are
    written; the count returned includes them when this is the outermost transaction."""
    later: list[TaskInstance] = []  # due tasks past the first chunk: dispatched after the commit
    dispatched_later: list[int] = []
    unwritten = Unwritten()
    with transaction.atomic(savepoint=savepoint):
        run = created or locked_run(dag_run_id, skip_locked=skip_locked)
        if run is None or run.state not in (RunState.QUEUED, RunState.RUNNING):
            return 0, False
        if held_by_pause(run):  # a queued run of a paused DAG starts once it is unpaused
            return 0, False
        if run.state == RunState.QUEUED and not _start_run(run, now):
            return 0, False
        due, outcome = settling(run, now, unwritten)
        for ti in due:
            ti.dag_run = run
        due.sort(key=lambda ti: -ti.priority_weight)  # stable: by id within a weight
        due, later = due[:FIRST_DISPATCH_CHUNK], due[FIRST_DISPATCH_CHUNK:]
        # Pools, limits and circuits decide which of the ready tasks go now.
        dispatched = dispatch_ready(run, due, now, unwritten=unwritten.pks)
        unwritten.write(due)  # made ready but not dispatched after all: scheduled
        finished = _finish_if_done(run, outcome, now)
        if later:
            # Registered after the first chunk's enqueue: its jobs are on Redis before the next
            # chunk is written. The later chunks' tasks made ready in memory stay `none` until
            # their own chunk moves them on (`Unwritten`).
            transaction.on_commit(lambda: dispatched_later.append(dispatch_later(dag_run_id, later, now, unwritten=unwritten)))
        # An attempt row for each task dispatched (registered after the later chunks: counted once they are written).
        tablestats.grew(TaskAttempt._meta.db_table, len(due) + len(later))
    return dispatched + sum(dispatched_later), finished


def _whole_run(
    run: DagRun, now: datetime, unwritten: Unwritten, *, known: list[TaskInstance] | None = None
) -> tuple[list[TaskInstance], RunState | None]:
    """`advance_run`'s settling: every task read (unless `known`: all of them, as read) and
    decided; the tasks it makes ready for the dispatch alone are left in `unwritten`, every other
    decision is written."""
    instances = instances_of(run) if known is None else known
    for ti in instances:
        ti.dag_run = run
    settle_whole_run(run, instances, now, unwritten)  # adds the instances of the mapped tasks it expands
    return [ti for ti in instances if is_due(ti, now)], run_outcome([ti.state for ti in instances])


def _first_ready(run: DagRun, now: datetime, unwritten: Unwritten) -> tuple[list[TaskInstance], RunState | None]:
    """`start_big_run`'s settling: in a run none of whose tasks has begun, only the tasks without
    upstreams may be ready; the first chunk of them by priority is read and settled, nothing
    else of the run. The run is not over (the whole run's settling, next, decides that)."""
    first = first_without_upstream(run, FIRST_DISPATCH_CHUNK)
    for ti in first:
        ti.dag_run = run
    settle_whole_run(run, first, now, unwritten)  # a mapped task among them expands
    return [ti for ti in first if is_due(ti, now)], None


def _downstream_of(
    run: DagRun, now: datetime, unwritten: Unwritten, *, ended: str, ended_states: list[str] | None
) -> tuple[list[TaskInstance], RunState | None]:
    """`advance_after_report`'s settling: `ended`'s downstream only (`settle_downstream_of`)."""
    due = settle_downstream_of(run, ended, now, ended_states, unwritten)
    # A task due to run is not finished: the run cannot be over, nothing to count.
    return due, None if due else outcome_counted(run)


def _start_run(run: DagRun, now: datetime) -> bool:
    # The DAG row is locked while counting and starting: two schedulers (or a trigger and a
    # scheduler) starting runs of one DAG at once would each count the same running runs.
    if connection.vendor == "postgresql":
        started = _start_if_slot_free(run, now)
    elif may_start_run(run.dag.max_active_runs, active_runs(run.dag_id, locked=True)):
        started = bool(sql.execute(_START_SQL, [connection.ops.adapt_datetimefield_value(now), run.pk], prepare=True))
    else:
        started = None
    if started is None:  # no slot free
        return False
    if started:
        run.state, run.start_date = RunState.RUNNING, now
        return True
    run.refresh_from_db(fields=["state", "start_date"])
    return run.state == RunState.RUNNING


_START_SQL = f"UPDATE orchestrator_dagrun SET state = '{RunState.RUNNING}', start_date = %s WHERE id = %s AND state = '{RunState.QUEUED}'"
# The DAG's running runs (a backfill's left out: `run_rules`) counted, and the run started if
# `may_start_run` allows it (fewer running than max_active_runs), in one statement whose parts
# share its snapshot: taken after the DAG's lock, so it counts a run the lock's last holder started.
_START_IF_SLOT_FREE_SQL = (
    "WITH counted AS (SELECT COUNT(*) AS running FROM orchestrator_dagrun r"
    f" WHERE r.dag_id = %s AND r.state = '{RunState.RUNNING}' AND r.backfill_id IS NULL),"
    f" started AS (UPDATE orchestrator_dagrun SET state = '{RunState.RUNNING}', start_date = %s FROM counted"
    f" WHERE orchestrator_dagrun.id = %s AND orchestrator_dagrun.state = '{RunState.QUEUED}' AND counted.running < %s RETURNING 1)"
    " SELECT counted.running, (SELECT COUNT(*) FROM started) FROM counted"
)


def _start_if_slot_free(run: DagRun, now: datetime) -> bool | None:
    """PostgreSQL's start: None when no slot is free, else whether this start moved the run. The
    lock is a statement of its own, before the count: a statement that waited for a lock still
    reads with the snapshot it took before the wait (`active_runs`)."""
    lock_dag(run.dag_id)
    rows = sql.fetch(
        _START_IF_SLOT_FREE_SQL,
        [run.dag_id, connection.ops.adapt_datetimefield_value(now), run.pk, run.dag.max_active_runs],
        [None, None],
        prepare=True,  # by keys, for every run
    )
    running, started = rows[0]
    if not may_start_run(run.dag.max_active_runs, ActiveRuns(running=running, queued=0)):
        return None
    return bool(started)


def _finish_if_done(run: DagRun, outcome: RunState | None, now: datetime) -> bool:
    """End the run if every task is done (`outcome` is not None). The outcome may be a little
    stale: a task that finished since is seen by its worker's own advance_run(), which waits
    for our lock."""
    if outcome is None:
        return False
    with transaction.atomic(savepoint=False):
        ended = DagRun.objects.filter(pk=run.pk, state=RunState.RUNNING).update(state=outcome, end_date=now)
        if not ended:
            return False
        run.state, run.end_date = outcome, now
        lifecycle.run_finished(run, now)
        hook = "on_dag_run_success" if outcome == RunState.SUCCESS else "on_dag_run_failed"
        transaction.on_commit(lambda: notify(hook, dag_run=run))
    return True


# A wide run's due tasks are dispatched in committed chunks: the first (enough to fill a few
# workers' slots) with the run's settling, the others, of DISPATCH_CHUNK each, in a transaction
# of their own after that commit. The first tasks' jobs reach Redis (and a worker) while the
# rest are still being written, instead of after one transaction that writes them all.
FIRST_DISPATCH_CHUNK = 100
DISPATCH_CHUNK = 500


def dispatch_later(dag_run_id: int, due: list[TaskInstance], now: datetime, *, unwritten: Unwritten) -> int:
    """Dispatch the rest of a run's due tasks, a chunk per transaction, once the transaction that
    settled them committed; returns how many went. `unwritten`: the settling's record of those of
    them still `none` in the database; each chunk writes `scheduled` for any of its own it does
    not dispatch.

    Each chunk locks the run again and goes only while the run is running and its DAG not
    paused. Every dispatch is fenced by the (state, token) it was read with, so a task someone
    else dispatched or cleared meanwhile is left alone, and pools, limits and circuits admit
    each chunk under their locks as they would any dispatch. Whatever is not dispatched here
    (an error, a crash between chunks) stays scheduled, or `none` with its upstreams done, and
    the next scheduler pass, which looks for runs with due or settleable tasks, dispatches it:
    the error is logged, never raised into the caller, whose own change is committed already."""
    dispatched = 0
    try:
        for start in range(0, len(due), DISPATCH_CHUNK):
            _mark_dispatching(dag_run_id)
            went = _dispatch_chunk_later(dag_run_id, due, start, now, unwritten)
            if went is None:
                return dispatched
            dispatched += went
    finally:
        _mark_dispatched(dag_run_id)
    return dispatched


def _dispatch_chunk_later(dag_run_id: int, due: list[TaskInstance], start: int, now: datetime, unwritten: Unwritten) -> int | None:
    """One chunk of `dispatch_later` in its own transaction: how many went, or None to stop (the
    run is no longer running, its DAG paused, or the chunk failed)."""
    chunk = due[start : start + DISPATCH_CHUNK]
    try:
        with transaction.atomic():
            run = locked_run(dag_run_id, skip_locked=False)
            if run is None or run.state != RunState.RUNNING or held_by_pause(run):
                return None
            for ti in chunk:
                ti.dag_run = run
            went = dispatch_ready(run, chunk, now, unwritten=unwritten.pks)
            unwritten.write(chunk)
    except Exception:
        log.exception("could not dispatch %d due task(s) of run %s; the next scheduler pass will", len(due) - start, dag_run_id)
        return None
    return went


def _mark_dispatching(dag_run_id: int) -> None:
    """Tell the scheduler this run's chunks are on their way (`enqueuing`); without Redis the
    scheduler may race the chunks, which the fences make safe."""
    try:
        enqueuing.dispatching(get_redis(), dag_run_id)
    except Exception:
        log.warning("could not mark run %s as being dispatched", dag_run_id, exc_info=True)


def _mark_dispatched(dag_run_id: int) -> None:
    try:
        enqueuing.dispatched(get_redis(), dag_run_id)
    except Exception:
        log.warning("could not clear run %s's dispatch marker; it expires", dag_run_id, exc_info=True)
