"""The task process: forked warm by the worker's fork server, in its own session and process
group, it runs one attempt (`run_forked`).

It reads its payload and its upstreams' results from the control pipe, imports the task, fires
`task.before_running`, sends the "running" handshake on the message pipe and waits for the
supervisor's "go" (the supervisor owns all database reporting), fires `task.after_running`,
runs the user code and sends the outcome. A bash task execs bash at that point instead. On
SIGTERM a Python task reads why it is being stopped (the supervisor writes the reason first),
calls the task's `on_kill(execution_context)` and exits. It dies with the fork server
(PR_SET_PDEATHSIG), which dies with the worker.
"""
from __future__ import annotations

import ctypes
import inspect
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from django.core.exceptions import AppRegistryNotReady

from orchestrator.foundation.importing import ObjectImportError, import_object
from orchestrator.foundation.results import check_result
from orchestrator.foundation.task_state import DEFAULT_MAX_KEYS, STATE_REPLY, TaskStateStore
from orchestrator.foundation.templating import TEMPLATE_NAMES, render
from orchestrator.worker.channel import LineReader, send
from orchestrator.worker.classify import exception_facts

PR_SET_PDEATHSIG = 1
# When the payload does not say (ORCHESTRATOR_RESULT_MAX_BYTES's default).
DEFAULT_RESULT_MAX_BYTES = 65536
# The exit status after the SIGTERM handler ran: 128 + SIGTERM, as a shell reports it.
TERMINATED_EXIT = 128 + signal.SIGTERM


# Loaded once, in the fork server: each task process would otherwise load it again.
LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def set_parent_death_signal(expected_parent: int | None = None) -> None:
    """Ask Linux to SIGKILL this process when its parent dies; exit now if it already has."""
    if LIBC is not None:
        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)  # the parent died before the death signal was armed


def import_callable(path: str) -> Any:
    """The task's callable, by the same resolver the spec validation used.

    A module that uses Django models needs the apps loaded: only then is that cost paid.
    """
    try:
        return import_object(path)
    except ObjectImportError as exc:
        if not isinstance(exc.__cause__, AppRegistryNotReady):
            raise
    import django

    django.setup()
    return import_object(path)


def accepts_context(function: Callable) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "context" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def outcome_of(result: Any, max_bytes: int) -> dict[str, Any]:
    """The outcome message for a return value: success with it, or invalid_result saying why."""
    problem = check_result(result, max_bytes)
    if problem is not None:
        return {"type": "invalid_result", "problem": problem}
    return {"type": "success", "result": result}


class PythonTask:
    def __init__(
        self, target: Any, op_kwargs: dict[str, Any], context: dict[str, Any], result_max_bytes: int = DEFAULT_RESULT_MAX_BYTES
    ) -> None:
        self.target = target
        self.op_kwargs = op_kwargs
        self.context = context
        self.result_max_bytes = result_max_bytes
        self.instance: Any = None

    def on_kill(self) -> Callable | None:
        holder = self.instance if self.instance is not None else self.target
        return getattr(holder, "on_kill", None)

    def run(self) -> dict[str, Any]:
        if inspect.isclass(self.target):
            self.instance = self.target(**self.op_kwargs)
            result = self.instance.execute(self.context)
        elif accepts_context(self.target) and "context" not in self.op_kwargs:
            result = self.target(**self.op_kwargs, context=self.context)
        else:
            result = self.target(**self.op_kwargs)
        return outcome_of(result, self.result_max_bytes)


class BashTask:
    def __init__(self, command: str, context: dict[str, Any], mapped: dict[str, Any] | None = None) -> None:
        # Raises RenderError (a startup error) for a command that cannot be given its values.
        self.command, self.env = render(command, context, mapped)
        self.context = context

    def on_kill(self) -> Callable | None:
        return None  # bash gets the supervisor's SIGTERM itself

    def exec(self) -> NoReturn:
        """Become bash: same pid, same process group, the supervisor's signals reach it directly.
        The command's substituted values are in its environment, never in its text."""
        sys.stdout.flush()
        sys.stderr.flush()
        os.execvpe("bash", ["bash", "-c", self.command], {**os.environ, **self.env})


def load_task(payload: dict[str, Any]) -> PythonTask | BashTask:
    context = payload["context"]
    if payload.get("bash_command"):
        return BashTask(payload["bash_command"], context, payload.get("mapped"))
    path = payload.get("python_callable") or ""
    if not path:
        raise ImportError(f"task {payload.get('task_id')!r} has neither python_callable nor bash_command")
    target = import_callable(path)
    max_bytes = int(payload.get("result_max_bytes", DEFAULT_RESULT_MAX_BYTES))
    return PythonTask(target, dict(payload.get("op_kwargs") or {}), context, max_bytes)


def context_environment(context: dict[str, Any]) -> dict[str, str]:
    """The context as environment variables, for bash tasks and anything they start."""
    return {f"ORCHESTRATOR_{name.upper()}": str(context[name]) for name in TEMPLATE_NAMES if name in context}


def run_forked(channel_fd: int) -> int:
    """The life of a task process once the fork server forked it; returns its exit code.

    A bash task's process becomes bash itself after the handshake (exec), so nothing of
    Python stays between the supervisor and the command.
    """
    os.set_inheritable(channel_fd, False)  # bash and user subprocesses must not hold it
    control = LineReader(channel_fd)
    payload = control.receive()
    results = control.receive() if payload is not None else None
    if payload is None or results is None:
        return 1
    payload["context"]["results"] = results
    os.environ.update(context_environment(payload["context"]))
    ids = {"task_instance_id": payload["task_instance_id"], "task_id": payload["task_id"]}
    try:
        from orchestrator.worker import failpoints

        task = load_task(payload)
        failpoints.fire(failpoints.TASK_BEFORE_RUNNING, **ids)
    except BaseException as exc:
        traceback.print_exc()
        send(channel_fd, {"type": "startup_error", "exception": exception_facts(exc)})
        return 1

    send(channel_fd, {"type": "running", "pid": os.getpid()})
    reply = control.receive()
    if reply is None or reply.get("type") != "go":
        return 0  # the supervisor refused the handshake (stale attempt) or is gone

    if isinstance(task, BashTask):
        failpoints.fire(failpoints.TASK_AFTER_RUNNING, **ids)
        task.exec()  # never returns: bash's exit status is the outcome
    inbox = ControlInbox(control)
    attach_task_state(task.context, inbox, channel_fd, payload)
    signal.signal(signal.SIGTERM, _terminate_handler(task, inbox, channel_fd))
    try:
        failpoints.fire(failpoints.TASK_AFTER_RUNNING, **ids)
        outcome = task.run()
    except SystemExit as exc:
        if exc.code in (None, 0):
            outcome = {"type": "success", "result": None}
        else:
            traceback.print_exc()
            send(channel_fd, {"type": "failure", "exception": exception_facts(exc)})
            return 1
    except BaseException as exc:
        traceback.print_exc()
        send(channel_fd, {"type": "failure", "exception": exception_facts(exc)})
        return 1
    # Everything it printed is in the pipes before its outcome: a success is reported as soon
    # as the supervisor reads it, without waiting for this process to end.
    flush_output()
    send(channel_fd, outcome)
    return 0 if outcome["type"] == "success" else 1


class ControlInbox:
    """The supervisor's messages once user code runs: answers to task state changes, and the
    "stop" it writes before SIGTERM. A stop read while waiting for an answer is kept for the
    SIGTERM handler."""

    def __init__(self, control: LineReader) -> None:
        self.control = control
        self.stop: dict[str, Any] | None = None

    def reply(self, timeout: float | None) -> dict[str, Any] | None:
        while True:
            message = self.control.receive(timeout=timeout)
            if message is None:
                return None
            if message.get("type") == "stop":
                self.stop = message
            elif message.get("type") == STATE_REPLY:
                return message

    def stop_message(self, timeout: float) -> dict[str, Any] | None:
        if self.stop is None:
            message = self.control.receive(timeout=timeout)
            while message is not None and message.get("type") != "stop":
                message = self.control.receive(timeout=timeout)
            self.stop = message
        return self.stop


def attach_task_state(context: dict[str, Any], inbox: ControlInbox, channel_fd: int, payload: dict[str, Any]) -> None:
    """Give a Python task its `context["task_state"]`, talking to the supervisor over the pipes."""
    if "task_state" not in context:
        return

    def request(message: dict[str, Any]) -> dict[str, Any] | None:
        if not send(channel_fd, message):
            return None
        return inbox.reply(timeout=None)  # the supervisor answers once it is durable, or kills us

    context["task_state"] = TaskStateStore(
        context.get("task_state") or {},
        request,
        max_bytes=int(payload.get("task_state_max_bytes") or 65536),
        max_keys=int(payload.get("task_state_max_keys") or DEFAULT_MAX_KEYS),
    )


def _terminate_handler(task: PythonTask | BashTask, inbox: ControlInbox, channel_fd: int) -> Callable:
    from retries.context import ExecutionContext
    from retries.states import Reason, Source

    def handle(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # on_kill runs once
        # The supervisor writes why before it signals; anything else is a stop from outside.
        message = inbox.stop_message(timeout=1.0)
        if message and message.get("type") == "stop" and message.get("context"):
            context = ExecutionContext.from_dict(message["context"])
        else:
            context = ExecutionContext.of(Reason.WORKER_TERMINATION, Source.WORKER, signal="SIGTERM", external=True)
        on_kill = task.on_kill()
        if on_kill is not None:
            try:
                on_kill(context)
            except BaseException:
                traceback.print_exc()
        send(channel_fd, {"type": "terminated", "context": context.to_dict()})
        exit_now(TERMINATED_EXIT)

    return handle


def flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def exit_now(code: int) -> NoReturn:
    """Flush what the task printed, then end the process at once (no atexit, no cleanup of
    state shared with the fork server)."""
    flush_output()
    os._exit(code)


