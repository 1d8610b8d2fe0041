"""Which ready tasks may be dispatched now, given pools and concurrency limits. Pure.

The engine reads the candidates (ready tasks) and what is in use under its locks, asks
`admit()`, dispatches the admitted and marks the rest as waiting. Nothing here reads a
database or a clock.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from retries.states import WaitKind


@dataclass(frozen=True)
class Candidate:
    """A task instance that is ready to run and subject to at least one limit."""

    key: int  # the task instance's id
    dag_id: str
    task_id: str
    run_order: datetime  # its run's queued_at: the older run goes first at equal priority
    priority_weight: int = 1
    pool: str | None = None
    pool_slots: int = 1
    max_active_tis_per_dag: int | None = None
    run_key: int | None = None  # its run's id, for max_active_tis_per_dagrun
    max_active_tis_per_dagrun: int | None = None


@dataclass(frozen=True)
class Hold:
    """Why a candidate waits: its `waiting_for` kind and name."""

    kind: WaitKind
    name: str


@dataclass
class Usage:
    """Capacity and what queued and running tasks hold of it now."""

    pool_slots: Mapping[str, int] = field(default_factory=dict)  # a pool missing here has no slots
    pool_used: Mapping[str, int] = field(default_factory=dict)
    dag_limit: Mapping[str, int | None] = field(default_factory=dict)  # max_active_tasks; None = no limit
    dag_active: Mapping[str, int] = field(default_factory=dict)
    task_active: Mapping[tuple[str, str], int] = field(default_factory=dict)
    run_task_active: Mapping[tuple[int, str], int] = field(default_factory=dict)  # (run id, task id)


def rank(candidate: Candidate) -> tuple[int, datetime, int]:
    """Higher priority_weight first, then the older run, then the task created first."""
    return (-candidate.priority_weight, candidate.run_order, candidate.key)


def ranked(candidates: Iterable[Candidate]) -> list[Candidate]:
    return sorted(candidates, key=rank)


def admit(candidates: Iterable[Candidate], usage: Usage) -> tuple[list[int], dict[int, Hold]]:
    """Walk the candidates best first; admit each that fits every limit, hold the others.

    Within one pool nobody overtakes: once a candidate waits for a pool, lower-ranked
    candidates of that pool wait too, so a task needing several slots is not starved by
    smaller ones and a freed slot always goes to the best-ranked waiter. A candidate held by
    a different limit reserves nothing.
    """
    pool_used = dict(usage.pool_used)
    dag_active = dict(usage.dag_active)
    task_active = dict(usage.task_active)
    run_task_active = dict(usage.run_task_active)
    blocked_pools: set[str] = set()
    admitted: list[int] = []
    held: dict[int, Hold] = {}
    for c in ranked(candidates):
        hold = _first_limit_hit(c, usage, pool_used, dag_active, task_active, run_task_active, blocked_pools)
        if hold is not None:
            held[c.key] = hold
            if hold.kind is WaitKind.POOL:
                blocked_pools.add(hold.name)
            continue
        admitted.append(c.key)
        if c.pool is not None:
            pool_used[c.pool] = pool_used.get(c.pool, 0) + c.pool_slots
        dag_active[c.dag_id] = dag_active.get(c.dag_id, 0) + 1
        task_active[(c.dag_id, c.task_id)] = task_active.get((c.dag_id, c.task_id), 0) + 1
        if c.run_key is not None:
            run_task_active[(c.run_key, c.task_id)] = run_task_active.get((c.run_key, c.task_id), 0) + 1
    return admitted, held


def _first_limit_hit(
    c: Candidate,
    usage: Usage,
    pool_used: Mapping[str, int],
    dag_active: Mapping[str, int],
    task_active: Mapping[tuple[str, str], int],
    run_task_active: Mapping[tuple[int, str], int],
    blocked_pools: set[str],
) -> Hold | None:
    limit = usage.dag_limit.get(c.dag_id)
    if limit is not None and dag_active.get(c.dag_id, 0) >= limit:
        return Hold(WaitKind.MAX_ACTIVE_TASKS, c.dag_id)
    if c.max_active_tis_per_dag is not None and task_active.get((c.dag_id, c.task_id), 0) >= c.max_active_tis_per_dag:
        return Hold(WaitKind.MAX_ACTIVE_TIS_PER_DAG, c.task_id)
    if (
        c.max_active_tis_per_dagrun is not None
        and c.run_key is not None
        and run_task_active.get((c.run_key, c.task_id), 0) >= c.max_active_tis_per_dagrun
    ):
        return Hold(WaitKind.MAX_ACTIVE_TIS_PER_DAG, c.task_id)
    if c.pool is not None:
        free = usage.pool_slots.get(c.pool, 0) - pool_used.get(c.pool, 0)
        if c.pool in blocked_pools or c.pool_slots > free:
            return Hold(WaitKind.POOL, c.pool)
    return None
