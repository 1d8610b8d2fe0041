"""The worker side of a deadline callback: the RQ job `run_callback` and what it calls.

A callback is a dotted-path callable or a built-in notifier. It runs with a time
bound (callback_kwargs `timeout`, default ORCHESTRATOR_DEADLINE_CALLBACK_TIMEOUT), so one that
raises or hangs is recorded as failed and never holds up the check or other callbacks: a
built-in notifier in a thread, user code in a child process that is killed at the bound. The job
records the outcome on the deadline with conditional updates keyed on the dispatch token: a
stale job (its dispatch was superseded) changes nothing.
"""
from __future__ import annotations

import inspect
import logging
import multiprocessing
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.utils import timezone

from deadlines import notifiers, queueing
from deadlines.conf import int_setting, setting
from deadlines.models import Deadline
from deadlines.resolution import seconds_late
from orchestrator.foundation.importing import import_object
from retries.backoff import Backoff, ceiling

log = logging.getLogger(__name__)

ERROR_LIMIT = 2000
# A running callback's lease: its own bound plus time to record the outcome.
RUNNING_LEASE_MARGIN = 30


class CallbackTimeout(Exception):
    """The callback did not return within its bound."""


class CallbackError(Exception):
    """The callback cannot be called (it does not import, or it is not callable)."""

    def __init__(self, message: str, *, permanent: bool = True) -> None:
        super().__init__(message)
        self.permanent = permanent


# --- the RQ job --------------------------------------------------------------------------------


def run_callback(deadline_id: int, kind: str, token: int, **extra: Any) -> str:
    """Run one dispatch of a deadline's callback; return what happened (kept as the job's result)."""
    deadline = Deadline.objects.select_related("dag_run__dag").filter(pk=deadline_id).first()
    if deadline is None:
        return "gone"
    _, timeout = queueing.callback_options(deadline.callback_kwargs or {})
    now = timezone.now()
    if not _start(deadline, kind, token, timeout, now):
        log.info("deadline %s %s callback dispatch %s is stale; skipped", deadline_id, kind, token)
        return "stale"
    try:
        invoke(deadline, at_risk=kind == queueing.AT_RISK, timeout=timeout, extra=extra)
    except Exception as exc:
        _record_failure(deadline, kind, token, exc, timezone.now())
        return "failed"
    _record_success(deadline, kind, token)
    return "success"


def _start(deadline: Deadline, kind: str, token: int, timeout: float, now: datetime) -> bool:
    if kind == queueing.AT_RISK:
        rows = Deadline.objects.filter(pk=deadline.pk, warn_callback_state=Deadline.CallbackState.QUEUED)
        return rows.update(warn_callback_state=Deadline.CallbackState.RUNNING) == 1
    rows = Deadline.objects.filter(pk=deadline.pk, callback_state=Deadline.CallbackState.QUEUED, callback_attempts=token)
    lease = now + timedelta(seconds=timeout + RUNNING_LEASE_MARGIN)
    return rows.update(callback_state=Deadline.CallbackState.RUNNING, callback_next_at=lease) == 1


def _record_success(deadline: Deadline, kind: str, token: int) -> None:
    if kind == queueing.AT_RISK:
        Deadline.objects.filter(pk=deadline.pk, warn_callback_state=Deadline.CallbackState.RUNNING).update(
            warn_callback_state=Deadline.CallbackState.SUCCESS
        )
        return
    Deadline.objects.filter(pk=deadline.pk, callback_state=Deadline.CallbackState.RUNNING, callback_attempts=token).update(
        callback_state=Deadline.CallbackState.SUCCESS, callback_next_at=None
    )


def _record_failure(deadline: Deadline, kind: str, token: int, exc: BaseException, now: datetime) -> None:
    message = describe(exc)
    if kind == queueing.AT_RISK:
        # One attempt: the miss, if it comes, is what gets retried.
        log.warning("deadline %s at-risk callback failed: %s", deadline.pk, message)
        Deadline.objects.filter(pk=deadline.pk, warn_callback_state=Deadline.CallbackState.RUNNING).update(
            warn_callback_state=Deadline.CallbackState.FAILED
        )
        return
    attempts = int_setting("ORCHESTRATOR_DEADLINE_CALLBACK_ATTEMPTS")
    permanent = bool(getattr(exc, "permanent", False))
    changes: dict[str, Any] = {"callback_error": f"dispatch {token} of {attempts}: {message}"[:ERROR_LIMIT]}
    if permanent or token >= attempts:
        changes.update(callback_state=Deadline.CallbackState.FAILED, callback_next_at=None)
        log.warning("deadline %s callback failed for good: %s", deadline.pk, changes["callback_error"])
    else:
        # The check dispatches the next attempt once the backoff has passed.
        # Uncapped in practice (attempts are few) and without jitter: one callback, no herd.
        delay = ceiling(token, float(setting("ORCHESTRATOR_DEADLINE_CALLBACK_RETRY_DELAY")), Backoff.EXPONENTIAL, float("inf"))
        changes.update(callback_state=Deadline.CallbackState.QUEUED, callback_next_at=now + timedelta(seconds=delay))
        log.warning("deadline %s callback failed, retry in %.1fs: %s", deadline.pk, delay, changes["callback_error"])
    Deadline.objects.filter(pk=deadline.pk, callback_state=Deadline.CallbackState.RUNNING, callback_attempts=token).update(
        **changes
    )


def describe(exc: BaseException) -> str:
    if isinstance(exc, ChildError):
        return str(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- calling the callback ----------------------------------------------------------------------


def idempotency_key(deadline: Deadline, *, at_risk: bool) -> str:
    """One key per deadline event (its miss, or its early warning), whatever the delivery."""
    return f"deadline-{deadline.pk}-{'at-risk' if at_risk else 'missed'}"


def build_context(deadline: Deadline, *, at_risk: bool, now: datetime | None = None, **extra: Any) -> dict[str, Any]:
    """What a callback learns about the deadline. `lateness_seconds` is how late it was when the
    miss was found (negative while at risk: the time that was left)."""
    run = deadline.dag_run
    at = (deadline.warned_at if at_risk else deadline.resolved_at) or now or timezone.now()
    context: dict[str, Any] = {
        "event": "deadline_at_risk" if at_risk else "deadline_missed",
        "deadline_id": deadline.pk,
        "dag_id": run.dag.dag_id,
        "run_id": run.run_id,
        "task_id": deadline.task_id,
        "scope": deadline.scope,
        "reference": deadline.reference,
        "need_by": deadline.need_by.isoformat(),
        "logical_date": run.logical_date.isoformat(),
        "lateness_seconds": seconds_late(deadline.need_by, at),
        "at_risk": at_risk,
        # Callbacks are delivered at least once (a worker lost mid-call means another call): the
        # same event always carries the same key, so a receiver can drop a duplicate.
        "idempotency_key": idempotency_key(deadline, at_risk=at_risk),
    }
    if at_risk and extra.get("estimate") is not None:
        context["estimated_remaining_seconds"] = extra["estimate"]
    return context


def invoke(deadline: Deadline, *, at_risk: bool, timeout: float, extra: Mapping[str, Any] | None = None) -> None:
    """Call the deadline's callback with its kwargs and context, within `timeout` seconds.

    A built-in notifier runs in a thread (its own I/O is bounded by the same timeout); a
    dotted-path callable is user code that may hang for good, so it runs in a child process
    that is killed at the bound.
    """
    context = build_context(deadline, at_risk=at_risk, **dict(extra or {}))
    kwargs = {k: v for k, v in (deadline.callback_kwargs or {}).items() if k not in queueing.RESERVED_KWARGS}
    callback = deadline.callback
    name = f"deadline-{deadline.pk}-callback"
    if callback.startswith(notifiers.PREFIX):
        notifiers.get(callback)  # an unknown notifier fails here, permanently
        call_in_thread(lambda: notifiers.call(callback, context, kwargs, timeout=timeout), timeout, name=name)
    else:
        function = load_callable(callback)
        call_in_process(lambda: call_user(function, kwargs, context), timeout, name=name)


def load_callable(path: str) -> Callable[..., Any]:
    try:
        function = import_object(path)
    except ImportError as exc:
        raise CallbackError(f"cannot import callback {path!r}: {exc}") from None
    if not callable(function):
        raise CallbackError(f"callback {path!r} is not callable")
    return function


def call_user(function: Callable[..., Any], kwargs: Mapping[str, Any], context: dict[str, Any]) -> None:
    """Like a task's python_callable: `context=` is passed when the callable takes it (or **kwargs)."""
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        params = []
    takes_context = any(p.name == "context" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    if takes_context:
        function(**kwargs, context=context)
    else:
        function(**kwargs)


def call_in_thread(call: Callable[[], None], timeout: float, *, name: str) -> None:
    """Run `call` in a daemon thread; raise what it raised, or CallbackTimeout after `timeout`."""
    errors: list[BaseException] = []
    done = threading.Event()

    def target() -> None:
        try:
            call()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()  # this thread's own connections only
            done.set()

    threading.Thread(target=target, name=name, daemon=True).start()
    if not done.wait(timeout):
        raise CallbackTimeout(f"callback did not return within {timeout:g}s")
    if errors:
        error = errors[0]
        if isinstance(error, Exception):
            raise error
        raise CallbackError(f"callback raised {type(error).__name__}", permanent=False)


def call_in_process(call: Callable[[], None], timeout: float, *, name: str) -> None:
    """Run `call` in a forked child; raise its error (as text), or CallbackTimeout after `timeout`,
    when the child is killed. The worker itself runs jobs in-process, so a hung call must not
    stay behind in it."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    # The child must not share the worker's database sockets; the worker reconnects lazily.
    connections.close_all()
    child = context.Process(target=_child_main, args=(call, sender), name=name, daemon=True)
    child.start()
    sender.close()
    try:
        if not receiver.poll(timeout):
            raise CallbackTimeout(f"callback did not return within {timeout:g}s")
        try:
            outcome = receiver.recv()
        except EOFError:
            outcome = ("error", f"the callback process died (exit code {_exit_code(child)})", False)
    finally:
        if child.is_alive():
            child.kill()
        child.join(5)
        receiver.close()
    if outcome[0] == "error":
        raise ChildError(outcome[1], permanent=outcome[2])


def _child_main(call: Callable[[], None], sender: Any) -> None:
    try:
        call()
    except BaseException as exc:
        sender.send(("error", describe(exc), bool(getattr(exc, "permanent", False))))
    else:
        sender.send(("ok", "", False))
    finally:
        connections.close_all()  # the child's own connections, opened by the callback


def _exit_code(child: Any) -> object:
    child.join(1)
    return child.exitcode


class ChildError(Exception):
    """The callback failed in its child process; the message is already "Type: text"."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent
