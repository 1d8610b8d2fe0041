"""Where events come from: a failed attempt and a dead letter (called by the failure report
inside its own transaction, once the failure is recorded there), a failed run and a missed
deadline (the listener hooks, on the listener thread). Each first asks the cached rules whether
any rule is about its kind of event, so a failure no rule is about costs nothing more; one that
a rule matches costs the report one INSERT (`incidents.queue_events`), and the sender does the
rest.
"""
from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connections

from alerts import incidents, rules_cache
from alerts.matching import Event
from alerts.models import When
from orchestrator.foundation.clock import shared_now
from orchestrator.listeners import hookimpl
from orchestrator.models import DagRun, TaskInstance
from retries.context import ExecutionContext
from retries.states import TaskState

log = logging.getLogger(__name__)


TRACEBACK = "Traceback (most recent call last):"


def _message(error: object, context: ExecutionContext | None) -> str:
    """What an event's sample says of the failure: the exception (`KeyError: 'x'`). A worker
    reports a task's exception as its traceback, whose first lines would fill the sample's 500
    characters with file names: its last line is the exception."""
    if isinstance(error, BaseException):
        text = str(error)
        return f"{type(error).__name__}: {text}" if text else type(error).__name__
    if error:
        text = str(error)
        if text.lstrip().startswith(TRACEBACK):
            last = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
            return last or text
        return text
    return str(context.reason.value) if context is not None else ""


def _task_event(kind: str, ti: TaskInstance, context: ExecutionContext, *, fingerprint: str | None, message: str, at: datetime) -> Event:
    run = ti.dag_run
    return Event(
        kind=kind,
        at=at,
        dag_id=run.dag.dag_id,
        run_id=run.run_id,
        dag_run_id=run.pk,
        owner=run.dag.owner,
        task_id=ti.task_id,
        map_index=ti.map_index,
        task_instance_id=ti.pk,
        category=context.category.value,
        reason=context.reason.value,
        fingerprint=fingerprint,
        queue=ti.queue,
        message=message,
    )


def task_failed(
    ti: TaskInstance,
    attempt_context: ExecutionContext,
    *,
    fingerprint: str | None,
    error: object = None,
    dead_lettered: ExecutionContext | None = None,
    at: datetime | None = None,
) -> None:
    """A failed attempt (every one), and the dead letter it caused if it did: queued for the
    rules that match, in the caller's transaction. Raises only the database's own errors (the
    report's transaction cannot go on after one); anything else is logged."""
    try:
        wanted_failed = bool(rules_cache.rules_for(When.TASK_FAILED))
        wanted_dead = dead_lettered is not None and bool(rules_cache.rules_for(When.TASK_DEAD_LETTERED))
        if not wanted_failed and not wanted_dead:
            return
        at = at or shared_now()
        message = _message(error, attempt_context)
        events = []
        if wanted_failed:
            events.append(_task_event(When.TASK_FAILED, ti, attempt_context, fingerprint=fingerprint, message=message, at=at))
        if wanted_dead and dead_lettered is not None:
            events.append(_task_event(When.TASK_DEAD_LETTERED, ti, dead_lettered, fingerprint=fingerprint, message=message, at=at))
    except DatabaseError:
        raise
    except Exception:
        log.exception("could not match the failure of task instance %s against the alert rules", ti.pk)
        return
    incidents.queue_events(events)


def run_failed(run: DagRun, at: datetime | None = None) -> None:
    """A run that failed: its category and reason are those of a failed task of it, if any."""
    if not rules_cache.rules_for(When.RUN_FAILED):
        return
    failed = (
        TaskInstance.objects.filter(dag_run_id=run.pk, state__in=[TaskState.FAILED, TaskState.DEAD_LETTER])
        .order_by("end_date", "id")
        .values_list("last_failure_context", "failure_fingerprint", "task_id")
        .first()
    )
    context: dict[str, Any] = (failed[0] if failed else None) or {}
    event = Event(
        kind=When.RUN_FAILED,
        at=at or run.end_date or shared_now(),
        dag_id=run.dag.dag_id,
        run_id=run.run_id,
        dag_run_id=run.pk,
        owner=run.dag.owner,
        category=context.get("category"),
        reason=context.get("reason"),
        fingerprint=failed[1] if failed else None,
        message=f"run failed (first failed task: {failed[2]})" if failed else "run failed",
    )
    incidents.queue_events([event])


def deadline_missed(deadline: Any, at: datetime | None = None) -> None:
    if not rules_cache.rules_for(When.DEADLINE_MISSED):
        return
    run = deadline.dag_run
    ti = deadline.task_instance if deadline.task_instance_id else None
    event = Event(
        kind=When.DEADLINE_MISSED,
        at=at or deadline.resolved_at or shared_now(),
        dag_id=run.dag.dag_id,
        run_id=run.run_id,
        dag_run_id=run.pk,
        owner=run.dag.owner,
        task_id=deadline.task_id or None,
        map_index=ti.map_index if ti is not None else None,
        task_instance_id=deadline.task_instance_id,
        queue=ti.queue if ti is not None else None,
        message=f"missed its {deadline.reference} deadline of {deadline.need_by.isoformat()}",
    )
    incidents.queue_events([event])


class _Hooks:
    """The listener hooks the alerts app implements (registered by AlertsConfig.ready)."""

    @hookimpl
    def on_dag_run_failed(self, dag_run: DagRun) -> None:
        try:
            run_failed(dag_run)
        finally:
            connections.close_all()  # the listener thread's own: these events are rare

    @hookimpl
    def on_deadline_missed(self, deadline: Any) -> None:
        try:
            deadline_missed(deadline)
        finally:
            connections.close_all()


HOOKS = _Hooks()
