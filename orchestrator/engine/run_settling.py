"""Settling a run's waiting tasks: what each becomes once its upstreams allow it (ready, that is
`scheduled`; upstream_failed; skipped; removed), recorded one fenced statement per kind.

Two ways in, one per way `run_advance` moves a run on: `settle_whole_run` decides every task of
a run read whole (the scheduler's pass, an operator action), `settle_downstream_of` only what
the end of one task can decide (a report), reading no more of the run than that.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from deadlines import lifecycle
from orchestrator.engine import storms
from orchestrator.engine.admission import is_limited
from orchestrator.engine.graph import dag_graph
from orchestrator.engine.mapping import expand_ready, is_unexpanded
from orchestrator.engine.rules import Readiness, readiness, taking_part
from orchestrator.engine.run_reads import (
    due_instances_of,
    states_of,
    upstream_states,
    waiting_and_due_instances,
    waiting_instances,
)
from orchestrator.engine.transitions import transition_many
from orchestrator.models import DagRun, TaskInstance
from retries.states import WAITING_TO_RUN_STATES, TaskState


def is_due(ti: TaskInstance, now: datetime) -> bool:
    return ti.state in (TaskState.SCHEDULED, TaskState.UP_FOR_RETRY) and (
        ti.next_retry_at is None or ti.next_retry_at <= now
    )


class Unwritten:
    """The tasks a report's settling made ready (`scheduled`) in memory only, still `none` in the
    database: the one record of that difference, from the settling to the dispatch.

    The dispatch expects them in `none` (`pks`) and moves them to `queued` in one statement, so a
    chain's next task is written once, not twice. `write` records `scheduled` for those of them
    not dispatched after all (a gate that closed meanwhile). A wide run's later chunks keep theirs
    here until their own chunk goes (`run_advance.dispatch_later`): a wide fan-out's report does
    not write `scheduled` for thousands of tasks before its first jobs can go. Left so by a crash,
    they are `none` tasks whose upstreams are done, and the scheduler's next pass settles them."""

    def __init__(self) -> None:
        self._tasks: dict[int, TaskInstance] = {}

    def make_ready(self, ti: TaskInstance) -> None:
        ti.state = TaskState.SCHEDULED
        self._tasks[ti.pk] = ti

    def __contains__(self, ti: TaskInstance) -> bool:
        return ti.pk in self._tasks

    @property
    def pks(self) -> frozenset[int]:
        """The ids of the tasks the database holds in `none`: what a dispatch's fence expects."""
        return frozenset(self._tasks)

    def write(self, among: Iterable[TaskInstance] | None = None) -> None:
        """Write `scheduled` for those of them (among `among`; all, without it) that were not
        dispatched, and forget those: the database then holds what their instances say."""
        pks = list(self._tasks) if among is None else [ti.pk for ti in among if ti.pk in self._tasks]
        left = [ti for ti in (self._tasks.pop(pk) for pk in pks) if ti.state == TaskState.SCHEDULED]
        if left:
            transition_many([(ti.pk, ti.attempt_token, TaskState.NONE) for ti in left], state=TaskState.SCHEDULED)


def settle_whole_run(run: DagRun, instances: list[TaskInstance], now: datetime, unwritten: Unwritten) -> None:
    """Decide the waiting tasks whose upstreams allow it: ready (scheduled), upstream_failed,
    skipped or removed; a mapped task that may run expands instead (`mapping.expand_ready`), and
    its new instances join `instances`. A task removed from its DAG while it waited to run
    (scheduled, or up_for_retry) is removed too, not dispatched to fail for want of a definition
    and spend the user's retries. One statement per kind of decision; settling one task can
    decide its downstream, so it repeats (in memory) until nothing changes.

    A task made ready that nothing but the dispatch's own fence can hold is made ready in
    `unwritten` only, as `settle_downstream_of` does: a run's first tasks are written once, at
    their dispatch."""
    defer = functools.partial(_dispatched_at_once, run, now)
    while True:
        states = _states_by_task(instances)
        waiting = [ti for ti in instances if ti.state == TaskState.NONE or removed_while_waiting(ti)]
        decided = _decide(waiting, functools.partial(_known_upstream_states, states))
        expanded, created = _expand_decided(decided, now)
        instances += created
        if not (_apply(decided, now, defer=defer, unwritten=unwritten) or expanded):
            return


def _known_upstream_states(states: dict[str, list[str]], ti: TaskInstance) -> list[str]:
    """The states of every instance of `ti`'s upstream tasks (a missing upstream counts as removed)."""
    return [state for u in _upstream_of(ti) for state in states.get(u, [TaskState.REMOVED])]


def _states_by_task(instances: list[TaskInstance]) -> dict[str, list[str]]:
    """Each task's instances' states (one for a task that is not mapped)."""
    states: dict[str, list[str]] = {}
    for ti in instances:
        states.setdefault(ti.task_id, []).append(ti.state)
    return {task_id: taking_part(task_states) for task_id, task_states in states.items()}


def _expand_decided(
    decided: dict[TaskState, list[TaskInstance]], now: datetime
) -> tuple[list[TaskInstance], list[TaskInstance]]:
    """Expand the mapped tasks among those decided ready (taking them out of `decided`).
    Returns the placeholders that moved (to instance 0, skipped or failed) and the instances
    created beside them, ready to dispatch."""
    moved: list[TaskInstance] = []
    created: list[TaskInstance] = []
    for ti in [ti for ti in decided.get(TaskState.SCHEDULED, []) if is_unexpanded(ti)]:
        decided[TaskState.SCHEDULED].remove(ti)
        expanded = expand_ready(ti, now)
        if expanded is None:
            continue  # another process expanded it: its next pass reads the instances
        moved.append(ti)
        for instance in expanded[1][1:]:
            instance.dag_run, instance.definition = ti.dag_run, ti.definition
            created.append(instance)
    return moved, created


def removed_while_waiting(ti: TaskInstance) -> bool:
    """Removed from its DAG while it waited to run (scheduled, or up_for_retry): it becomes
    removed, not dispatched to fail for want of a definition and spend the user's retries."""
    return ti.definition is None and ti.state in WAITING_TO_RUN_STATES


def settle_downstream_of(
    run: DagRun, ended: str, now: datetime, ended_states: list[str] | None, unwritten: Unwritten
) -> list[TaskInstance]:
    """Settle only what the end of task `ended` can decide: its waiting downstream tasks, and
    theirs in turn when one is decided without running (upstream_failed, skipped, removed).
    The rest of the run is not read. Returns the run's tasks due to run now: those it made
    ready, and those that were due already (read with its first waiting tasks, in one query);
    a task among them removed from its DAG while it waited to run is removed instead.

    A task it makes ready that nothing but the dispatch's own fence can hold (no circuit, no
    pool or limit, its queue not paused) is made ready in `unwritten` only (see `Unwritten`)."""
    due = _settle_downstream(run, ended, now, ended_states, unwritten)
    removed = [ti for ti in due if removed_while_waiting(ti)]
    if removed:
        _apply({TaskState.REMOVED: removed}, now)
    return [ti for ti in due if ti not in removed]


def _settle_downstream(
    run: DagRun, ended: str, now: datetime, ended_states: list[str] | None, unwritten: Unwritten
) -> list[TaskInstance]:
    graph = dag_graph(run.dag)
    first_downstream = sorted(graph.downstream.get(ended, ()))
    if not first_downstream:
        return due_instances_of(run, now)
    # The tasks just ended or decided: their instances' states.
    frontier = {ended: ended_states} if ended_states else states_of(run, [ended])
    waiting, due = waiting_and_due_instances(run, first_downstream, now)
    any_expanded = False
    while True:
        for ti in waiting:
            ti.dag_run = run
        decided = _decide(waiting, functools.partial(_upstream_states_of, run, frontier))
        expanded, _ = _expand_decided(decided, now)
        any_expanded = any_expanded or bool(expanded)
        settled = _apply(decided, now, defer=functools.partial(_dispatched_at_once, run, now), unwritten=unwritten) + expanded
        due += [ti for ti in settled if is_due(ti, now)]
        frontier = states_of(run, sorted({ti.task_id for ti in settled if ti.state != TaskState.SCHEDULED}))
        if not frontier:
            break
        waiting = waiting_instances(run, sorted({d for task_id in frontier for d in graph.downstream.get(task_id, ())}))
    if any_expanded:
        unwritten.write()  # the read below must see them
        return due_instances_of(run, now)  # with the instances the expansion created
    return sorted(due, key=lambda ti: ti.pk)


def _upstream_states_of(run: DagRun, known: dict[str, list[str]], ti: TaskInstance) -> list[str]:
    return upstream_states(run, _upstream_of(ti), known)


def _upstream_of(ti: TaskInstance) -> list[str]:
    return list(ti.definition.upstream) if ti.definition is not None else []


def _decide(
    waiting: list[TaskInstance], upstream_states_of: Callable[[TaskInstance], list[str]]
) -> dict[TaskState, list[TaskInstance]]:
    """What each waiting task becomes now, grouped by decision (a task that must wait is left out)."""
    decided: dict[TaskState, list[TaskInstance]] = {}
    for ti in waiting:
        target = _settled_state(ti, upstream_states_of)
        if target is not None:
            decided.setdefault(target, []).append(ti)
    return decided


def _apply(
    decided: dict[TaskState, list[TaskInstance]],
    now: datetime,
    *,
    defer: Callable[[TaskInstance], bool] | None = None,
    unwritten: Unwritten | None = None,
) -> list[TaskInstance]:
    """Record the decisions, one fenced statement per kind; returns the tasks that moved. A task
    made `scheduled` that `defer` picks is made ready in `unwritten` only."""
    settled = []
    for target, tis in decided.items():
        if target == TaskState.SCHEDULED and defer is not None and unwritten is not None:
            for ti in [ti for ti in tis if defer(ti)]:
                unwritten.make_ready(ti)
                settled.append(ti)
            tis = [ti for ti in tis if ti not in unwritten]
            if not tis:
                continue
        changes: dict[str, Any] = {"state": target}
        if target != TaskState.SCHEDULED:
            changes["end_date"] = now
        won = transition_many([(ti.pk, ti.attempt_token, ti.state) for ti in tis], **changes)
        for ti in tis:
            if ti.pk in won:
                ti.state = target
                settled.append(ti)
                if target in (TaskState.UPSTREAM_FAILED, TaskState.SKIPPED):
                    lifecycle.task_finished(ti, now)  # a removed task's deadlines end with its run
    return settled


def _dispatched_at_once(run: DagRun, now: datetime, ti: TaskInstance) -> bool:
    """Whether a task made ready now goes to the dispatch with nothing but its fence to pass:
    no circuit, no pool or limit (`admission`), its queue not paused."""
    return not ti.circuit and not is_limited(ti, run.dag) and ti.queue not in storms.paused_queues(now)


def _settled_state(ti: TaskInstance, upstream_states_of: Callable[[TaskInstance], list[str]]) -> TaskState | None:
    """What a waiting task becomes now, or None while it must wait."""
    if ti.definition is None:
        return TaskState.REMOVED
    verdict = readiness(ti.definition.trigger_rule, upstream_states_of(ti))
    if verdict is Readiness.WAIT:
        return None
    return {
        Readiness.RUN: TaskState.SCHEDULED,
        Readiness.UPSTREAM_FAILED: TaskState.UPSTREAM_FAILED,
        Readiness.SKIPPED: TaskState.SKIPPED,
    }[verdict]
