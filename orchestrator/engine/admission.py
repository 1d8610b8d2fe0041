"""Dispatching ready tasks through pools, concurrency limits, circuits and paused queues.

`dispatch_ready()` is what advance_run() calls with the run's due tasks. A task that nothing
limits is dispatched at once. A task whose circuit is open (or whose queue is paused) is held.
A task under a pool, `max_active_tasks`, `max_active_tis_per_dag` or `max_active_tis_per_dagrun`
is admitted under locks:
on PostgreSQL one transaction-scoped advisory lock per pool and per limited DAG, taken in one
sorted order, so any number of schedulers and workers count the slots held and give them out
one at a time (on SQLite, writers are serialised already). Held tasks stay scheduled or
up_for_retry with `waiting_for` set; nothing is charged for the wait.
"""
from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.db.models import Count, Q, Sum

from orchestrator.engine import circuits, storms, waitstart
from orchestrator.engine.dispatch import dispatch, dispatch_many
from orchestrator.engine.limit_args import limit_args
from orchestrator.engine.run_rules import not_held_by_pause
from orchestrator.engine.transitions import transition
from orchestrator.models import Dag, DagRun, Pool, TaskInstance
from retries.admission import Candidate, Hold, Usage, admit
from retries.circuits import Gate, gate
from retries.states import HOLD_FROM, SLOT_HOLDING_STATES, RunState, WaitKind

log = logging.getLogger(__name__)

# First key of every admission advisory lock: keeps them apart from any other advisory lock.
LOCK_NAMESPACE = 0x0AD1


class _Lost(Exception):
    """A probe claimed for a dispatch that then lost its race: undo the claim."""


@dataclass
class Gates:
    """What holds tasks regardless of capacity: their circuit's state, their queue's pause."""

    circuits: dict[str, circuits.Reading]
    paused_queues: set[str]
    now: datetime

    @classmethod
    def read(cls, tis: Iterable[TaskInstance], now: datetime) -> Gates:
        tis = list(tis)
        names = {ti.circuit for ti in tis if ti.circuit}
        return cls(circuits.read(names, now) if names else {}, storms.paused_queues(now), now)

    def verdict(self, ti: TaskInstance) -> tuple[Gate, Hold | None]:
        if ti.queue in self.paused_queues:
            return Gate.HOLD, Hold(WaitKind.QUEUE, ti.queue)
        if not ti.circuit:
            return Gate.PASS, None
        reading = self.circuits[ti.circuit]
        verdict = gate(reading.state, probe_in_flight=reading.probe_in_flight, release_at=ti.release_at, now=self.now)
        return verdict, Hold(WaitKind.CIRCUIT, ti.circuit) if verdict is Gate.HOLD else None


def dispatch_ready(run: DagRun, due: list[TaskInstance], now: datetime, *, unwritten: frozenset[int] = frozenset()) -> int:
    """Dispatch what may go now among `due` (ready tasks of `run`); return how many went.
    `unwritten`: tasks `scheduled` in memory only, still `none` in the database (see
    `run_settling.Unwritten`)."""
    if not due:
        return 0
    # A wait_for task holds no slot and goes to no worker: its wait begins instead.
    due, waiting = waitstart.split(run, due)
    dispatched = waitstart.begin(waiting, now, unwritten=unwritten) if waiting else 0
    if not due:
        return dispatched
    gates = Gates.read(due, now)
    limited: list[TaskInstance] = []
    free: list[TaskInstance] = []  # nothing holds or limits them: dispatched together
    for ti in due:
        verdict, hold = gates.verdict(ti)
        if hold is not None:
            set_waiting(ti, hold, now)
        elif is_limited(ti, run.dag):
            limited.append(ti)
        elif verdict is Gate.PROBE:
            dispatched += _go(ti, verdict, now)
        else:
            free.append(ti)
    dispatched += dispatch_many(free, now, unwritten=unwritten)
    if limited:
        dispatched += _admit(limited, gates, now)
    return dispatched


def moved_in_place(run: DagRun, instances: list[TaskInstance]) -> bool:
    """Whether `dispatch_ready` leaves what it does to any of `instances` on the very objects it
    is given, a dispatched one with no attempt but its dispatch's: none is limited (admitted
    from a read under locks), behind a circuit, or a wait_for task (whose wait begins instead)."""
    waits = waitstart.wait_tasks(run)
    return not any(is_limited(ti, run.dag) or ti.circuit or ti.task_id in waits for ti in instances)


def is_limited(ti: TaskInstance, dag: Dag) -> bool:
    return bool(ti.pool) or dag.max_active_tasks is not None or _task_limit(ti) is not None or _run_limit(ti) is not None


def _task_limit(ti: TaskInstance) -> int | None:
    return limit_args(ti.definition.args if ti.definition else None, ti.dag_run.dag.default_args)["max_active_tis_per_dag"]


def _run_limit(ti: TaskInstance) -> int | None:
    """max_active_tis_per_dagrun: how many of a mapped task's instances one run may run at once."""
    return limit_args(ti.definition.args if ti.definition else None)["max_active_tis_per_dagrun"]


def _go(ti: TaskInstance, verdict: Gate, now: datetime) -> bool:
    """Dispatch one task; a half-open circuit's task goes only if it wins the probe."""
    circuit = ti.circuit
    if verdict is not Gate.PROBE or not circuit:  # only a task behind a circuit is ever a probe
        return dispatch(ti, now)
    try:
        with transaction.atomic():
            if not circuits.claim_probe(circuit, ti.pk, ti.attempt_token + 1):
                raise _Lost
            if not dispatch(ti, now):
                raise _Lost
    except _Lost:
        set_waiting(ti, Hold(WaitKind.CIRCUIT, circuit), now)
        return False
    log.info("task instance %s is the probe of circuit %s", ti.pk, ti.circuit)
    return True


# --- admission under locks ----------------------------------------------------------------------


def _admit(limited: list[TaskInstance], gates: Gates, now: datetime) -> int:
    """Admit the best-ranked ready tasks across all runs that share a pool or a limited DAG."""
    pools = {ti.pool for ti in limited if ti.pool}
    dag_ids = {ti.dag_run.dag.dag_id for ti in limited}
    # Everyone who competes for the same slots, from any run; then everything they compete in.
    rivals = _waiting(pools, dag_ids, now)
    lock_pools = pools | {ti.pool for ti in rivals if ti.pool}
    lock_dags = dag_ids | {ti.dag_run.dag.dag_id for ti in rivals}
    _lock(lock_pools, lock_dags)
    # Re-read under the locks; a row another transaction holds is left for its next pass.
    candidates = [
        ti
        for ti in _waiting(pools, dag_ids, now, lock_rows=True)
        if (not ti.pool or ti.pool in lock_pools) and ti.dag_run.dag.dag_id in lock_dags
    ]
    gates = Gates.read(candidates, now) if candidates else gates
    ready = []
    for ti in candidates:
        verdict, hold = gates.verdict(ti)
        if hold is not None:
            set_waiting(ti, hold, now)
        elif is_limited(ti, ti.dag_run.dag):
            ready.append((ti, verdict))
        else:
            _go(ti, verdict, now)  # no longer limited (its DAG's limit was lifted)
    admitted, held = admit([_candidate(ti) for ti, _ in ready], _usage(lock_pools, lock_dags))
    admitted_keys = set(admitted)
    dispatched = 0
    for ti, verdict in ready:
        if ti.pk in admitted_keys:
            dispatched += _go(ti, verdict, now)
        else:
            set_waiting(ti, held[ti.pk], now)
    return dispatched


def _waiting(pools: set[str], dag_ids: set[str], now: datetime, *, lock_rows: bool = False) -> list[TaskInstance]:
    """Due, ready tasks in running runs of unpaused DAGs that use one of `pools` or belong to `dag_ids`."""
    rows = TaskInstance.objects.select_related("dag_run", "dag_run__dag", "definition").filter(
        Q(pool__in=pools) | Q(dag_run__dag__dag_id__in=dag_ids),
        Q(next_retry_at__isnull=True) | Q(next_retry_at__lte=now),
        not_held_by_pause("dag_run__"),
        state__in=HOLD_FROM,
        dag_run__state=RunState.RUNNING,
    )
    if lock_rows and connection.vendor == "postgresql":
        rows = rows.select_for_update(skip_locked=True, of=("self",))
    return list(rows.order_by("id"))


def _lock(pools: set[str], dag_ids: set[str]) -> None:
    """Transaction-scoped advisory locks, always taken in the same (sorted) order: no deadlock."""
    if connection.vendor != "postgresql":
        return
    keys = sorted([f"pool:{name}" for name in pools] + [f"dag:{dag_id}" for dag_id in dag_ids])
    with connection.cursor() as cursor:
        for key in keys:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_NAMESPACE, _key32(key)])


def _key32(key: str) -> int:
    """A stable signed 32-bit key; a collision only makes two resources share a lock."""
    value = zlib.crc32(key.encode())
    return value - 2**32 if value >= 2**31 else value


def _usage(pools: set[str], dag_ids: set[str]) -> Usage:
    """Slots and tasks held now by queued and running tasks (read after the locks are taken)."""
    active = TaskInstance.objects.filter(state__in=SLOT_HOLDING_STATES)
    pool_used = {
        pool: n  # pool__in leaves out the tasks without a pool
        for pool, n in active.filter(pool__in=pools).values_list("pool").annotate(n=Sum("pool_slots")).values_list("pool", "n")
        if pool is not None
    }
    by_dag = active.filter(dag_run__dag__dag_id__in=dag_ids)
    dag_active = dict(by_dag.values_list("dag_run__dag__dag_id").annotate(n=Count("id")).values_list("dag_run__dag__dag_id", "n"))
    task_active = {
        (dag_id, task_id): n
        for dag_id, task_id, n in by_dag.values_list("dag_run__dag__dag_id", "task_id").annotate(n=Count("id")).values_list(
            "dag_run__dag__dag_id", "task_id", "n"
        )
    }
    run_task_active = {
        (run_id, task_id): n
        for run_id, task_id, n in by_dag.values_list("dag_run_id", "task_id").annotate(n=Count("id")).values_list(
            "dag_run_id", "task_id", "n"
        )
    }
    return Usage(
        run_task_active=run_task_active,
        pool_slots=dict(Pool.objects.filter(name__in=pools).values_list("name", "slots")),
        pool_used=pool_used,
        dag_limit=dict(Dag.objects.filter(dag_id__in=dag_ids).values_list("dag_id", "max_active_tasks")),
        dag_active=dag_active,
        task_active=task_active,
    )


def _candidate(ti: TaskInstance) -> Candidate:
    return Candidate(
        key=ti.pk,
        dag_id=ti.dag_run.dag.dag_id,
        task_id=ti.task_id,
        run_order=ti.dag_run.queued_at,
        priority_weight=ti.priority_weight,
        pool=ti.pool or None,
        pool_slots=ti.pool_slots,
        max_active_tis_per_dag=_task_limit(ti),
        run_key=ti.dag_run_id,
        max_active_tis_per_dagrun=_run_limit(ti),
    )


# --- waiting_for ------------------------------------------------------------------------------------


def set_waiting(ti: TaskInstance, hold: Hold, now: datetime) -> None:
    """Show what holds the task; `since` is kept while the same thing holds it."""
    current = ti.waiting_for or {}
    if current.get("kind") == hold.kind and current.get("name") == hold.name:
        return
    waiting_for = {"kind": str(hold.kind), "name": hold.name, "since": now.isoformat()}
    if transition(ti.pk, expected=[ti.state], token=ti.attempt_token, waiting_for=waiting_for):
        ti.waiting_for = waiting_for
