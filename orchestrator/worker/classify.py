"""Classification at the source: what the supervisor saw, turned into an ExecutionContext.

Pure functions, no database and no processes: `exception_facts()` runs in the task process on
the exception it caught; `classify()` runs in the supervisor on everything it observed about
one attempt (`Outcome`) and returns what to report (`Verdict`).
"""
from __future__ import annotations

import dataclasses
import math
import re
import signal
import traceback
from dataclasses import dataclass, field
from typing import Any

from orchestrator.foundation.results import check_result, problem_message
from orchestrator.foundation.results import last_line as last_stdout_line
from orchestrator.worker.channel import MalformedMessage
from orchestrator.worker.final import BashExited, Failed, Final, InvalidResult, StartupFailed, Succeeded, Terminated, is_outcome
from retries.context import ExecutionContext
from retries.fingerprint import (
    bash_fingerprint,
    exception_fingerprint,
    fingerprint_of,
    last_line,
)
from retries.states import PreExecutionReason, Reason, Source, TaskState

# Bounds on what an exception may put in the attempt's context.
MAX_MESSAGE_CHARS = 2000
MAX_TRACEBACK_CHARS = 8000

# A connection failure reported by the client itself carries no SQLSTATE; recognise its text.
_CONNECTION_FAILURE = re.compile(
    r"connection refused|could not connect|connection to server .* failed|server closed the connection"
    r"|connection (?:is )?(?:closed|lost|reset|timed out)|could not translate host name|no route to host"
    r"|terminating connection|the connection is lost",
    re.IGNORECASE,
)
# Every message a task process sends, and the fields of each that must be objects. (A bash
# task's exit is seen by the supervisor, never sent: "bash_exit" is not the task's to say.)
TASK_MESSAGES: dict[str, tuple[str, ...]] = {
    "running": (),
    "success": (),
    "failure": ("exception",),
    "invalid_result": ("problem",),
    "startup_error": ("exception",),
    "terminated": ("context",),
    "task_state": (),
}
# Signals that stop a process on request (a shutdown, an operator), not a crash.
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


# --- in the task process ----------------------------------------------------------------------


def exception_facts(exc: BaseException) -> dict[str, Any]:
    """Everything the supervisor needs to classify a raised exception, as JSON-ready data."""
    from orchestrator.exceptions import NonRetryableError, Reschedule, RetryAfter

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    is_db_error, sqlstate = db_connection_failure(exc)
    return {
        "exception_type": _clip(type(exc).__name__, MAX_MESSAGE_CHARS),
        "exception_module": _clip(str(type(exc).__module__), MAX_MESSAGE_CHARS),
        "message": _clip(_text_of(exc), MAX_MESSAGE_CHARS),
        "traceback": _clip_tail(text, MAX_TRACEBACK_CHARS),
        "fingerprint": fingerprint_of(exc),
        "non_retryable": isinstance(exc, NonRetryableError),
        "retry_after": exc.seconds if isinstance(exc, RetryAfter) else None,
        "reschedule": exc.seconds if isinstance(exc, Reschedule) else None,
        "db_connection_error": is_db_error,
        "sqlstate": sqlstate,
    }


def _text_of(exc: BaseException) -> str:
    """str(exc), unless the exception cannot even say that: then what it is."""
    try:
        return str(exc)
    except Exception as problem:
        return f"<{type(exc).__name__}; its str() raised {type(problem).__name__}>"


def db_connection_failure(exc: BaseException) -> tuple[bool, str | None]:
    """Whether `exc` (or what caused it) is a database connection failure: an OperationalError
    (Django's, psycopg's or psycopg2's) with SQLSTATE class 08, or one with no SQLSTATE whose
    message says the connection was refused or lost."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any(klass.__name__ == "OperationalError" for klass in type(current).__mro__):
            sqlstate = getattr(current, "sqlstate", None) or getattr(current, "pgcode", None)
            if sqlstate:
                if str(sqlstate).startswith("08"):
                    return True, str(sqlstate)
            elif _CONNECTION_FAILURE.search(_text_of(current)):
                return True, None
        current = current.__cause__ or current.__context__
    return False, None


# --- in the supervisor ------------------------------------------------------------------------


@dataclass(frozen=True)
class Stop:
    """The supervisor stopped the task itself, and why."""

    # EXECUTION_TIMEOUT, WORKER_TERMINATION, DB_CONNECTION_ERROR (handshake not recorded), or
    # PRE_EXECUTION_FAILURE (no handshake in time)
    reason: Reason
    sigkill_sent: bool = False
    timeout: float | None = None  # the execution_timeout or startup timeout that ran out
    kill_grace: float | None = None
    shutdown_signal: str | None = None  # the signal the worker got, for worker_termination


@dataclass
class Outcome:
    """What the supervisor observed about one attempt."""

    is_bash: bool = False
    started: bool = True
    start_error: str | None = None
    # Nothing started because the task's own command cannot be (a value its environment cannot
    # hold, a template the shell would not expand): why. Charged to the task, never the platform.
    unstartable: str | None = None
    handshake: bool = False
    # The database refused to record the handshake (not for want of a connection): why. The task
    # was never told "go"; if it was started, the supervisor stopped it.
    handshake_refused: str | None = None
    returncode: int | None = None  # Popen convention: negative = killed by that signal
    fork_server_died: bool = False  # the task process died with the worker's fork server
    final: Final | None = None  # the task process's last word on how it ended (`final.py`)
    final_before_stop: bool = True
    stop: Stop | None = None
    stderr_tail: str = ""
    stdout_tail: str = ""  # a bash task's result is its last line
    stdout_truncated: bool = False
    result_max_bytes: int = 65536
    # The first thing on the task's channel that was no well-formed message (invalid_result
    # metadata), and the bytes of a line it left unfinished when its process ended.
    channel_problem: dict[str, Any] | None = None
    channel_unfinished: int = 0
    oom_kills_before: int | None = None  # the worker's memory cgroup's OOM kills
    oom_kills_after: int | None = None
    machine_oom_kills_before: int | None = None  # the machine's (/proc/vmstat)
    machine_oom_kills_after: int | None = None
    # The attempt's memory limit (MiB; None: none), how it was enforced ("cgroup" | "watched"),
    # the most it was seen to use, whether it went past the limit, and whether the kernel's OOM
    # killer stopped one of its processes under it (read from its own cgroup's counters).
    memory_limit_mib: int | None = None
    memory_enforced_by: str | None = None
    peak_memory_mib: int | None = None
    memory_exceeded: bool = False
    killed_by_host_oom: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)  # worker_name, hostname, pid


@dataclass(frozen=True)
class Verdict:
    success: bool
    result: Any = None
    context: ExecutionContext | None = None
    fingerprint: str | None = None
    retry_after: float | None = None
    error: str | None = None
    expected: tuple[TaskState, ...] = (TaskState.RUNNING,)
    # The task raised Reschedule(seconds): no failure, no success; it waits without a slot.
    reschedule: float | None = None


def classify(outcome: Outcome) -> Verdict:
    """The one place that names a failure seen by the worker."""
    base = dict(outcome.metadata)
    if outcome.returncode is not None:
        base["exit_code"] = outcome.returncode
        if outcome.returncode < 0:
            base["signal"] = signal_name(-outcome.returncode)
    expected = (TaskState.RUNNING,) if outcome.handshake else (TaskState.QUEUED,)

    if outcome.handshake_refused is not None:
        return _handshake_refused(outcome.handshake_refused, base)

    if outcome.unstartable is not None:
        # No platform retry would start it: application/startup_error at once, on the user's budget.
        context = ExecutionContext.of(Reason.STARTUP_ERROR, Source.WORKER, **base, error=_clip(outcome.unstartable, MAX_MESSAGE_CHARS))
        return Verdict(False, context=context, error=outcome.unstartable, expected=(TaskState.QUEUED,))

    if not outcome.started:
        # A command whose "running" was recorded before its start is still reported as never
        # having run: nothing of it started.
        context = _pre_execution(PreExecutionReason.START_ERROR, base, error=outcome.start_error)
        return Verdict(False, context=context, error=outcome.start_error, expected=expected)

    if outcome.memory_exceeded:
        # Past its own limit, whatever its processes did after: the task's failure.
        return _memory_limit_exceeded(outcome, base, expected)

    if outcome.channel_problem is not None:
        # The task's own channel, written against the rules: the task's failure, whatever followed.
        return _invalid_result(outcome.channel_problem, base, expected)
    if outcome.channel_unfinished and _ended_without_outcome(outcome):
        unfinished = _malformed("unfinished", f"{outcome.channel_unfinished} bytes without an end of line when the task process exited")
        return _invalid_result(unfinished, base, expected)

    final = outcome.final
    if outcome.fork_server_died and outcome.returncode == -signal.SIGKILL and not is_outcome(final):
        return _fork_server_died(outcome, base, expected)

    # A task that finished before the supervisor stopped it gets its real outcome.
    finished_first = outcome.handshake and outcome.final_before_stop and is_outcome(final)
    if outcome.stop is not None and not finished_first:
        return _stopped(outcome, base, expected)

    if not outcome.handshake:
        return _before_handshake(outcome, final, base)
    return _after_handshake(outcome, final, base)


def _after_handshake(outcome: Outcome, final: Final | None, base: dict[str, Any]) -> Verdict:
    """A task that ran and was not stopped: what its final word (or its death) says."""
    if isinstance(final, Succeeded):
        if outcome.is_bash:
            return _bash_success(outcome, base)
        # Checked again here: the task process's own check is not to be relied on.
        problem = check_result(final.result, outcome.result_max_bytes)
        if problem is not None:
            return _invalid_result(problem, base)
        return Verdict(True, result=final.result)
    if isinstance(final, InvalidResult):
        return _invalid_result(final.problem, base)
    if isinstance(final, Failed):
        return _exception(final.exception, base)
    if isinstance(final, BashExited):
        return _bash_exit(outcome, final.exit_code, base)
    return _died(outcome, final, base)


def stop_context(stop: Stop, **metadata: Any) -> ExecutionContext:
    """Why the supervisor stopped a task: what its on_kill is told, and what the attempt records."""
    if stop.reason is Reason.EXECUTION_TIMEOUT:
        return ExecutionContext.of(Reason.EXECUTION_TIMEOUT, Source.WORKER, timeout=stop.timeout, **metadata)
    if stop.reason is Reason.WORKER_TERMINATION:
        return ExecutionContext.of(Reason.WORKER_TERMINATION, Source.WORKER, **{**metadata, "signal": stop.shutdown_signal or "SIGTERM"})
    if stop.reason is Reason.DB_CONNECTION_ERROR:
        # The supervisor could not record the handshake: the metadata database is unreachable.
        return ExecutionContext.of(Reason.DB_CONNECTION_ERROR, Source.WORKER, during="handshake", **metadata)
    # No handshake in time: the process started but never reported running.
    return _pre_execution(PreExecutionReason.KILLED, metadata, startup_timeout=stop.timeout)


def handshake_refused_context(why: str, metadata: dict[str, Any]) -> ExecutionContext:
    """A task whose "running" the database refused could not be started: a pre-execution
    failure of kind `start_error`, retried on the platform budget as the retry rules say (then
    charged to the user as `startup_error`, so a handshake refused every time ends)."""
    return _pre_execution(PreExecutionReason.START_ERROR, metadata, during="handshake", handshake_refused=why)


def _handshake_refused(why: str, base: dict[str, Any]) -> Verdict:
    # Reported from `queued`, or from `running` should the refusal have come after the commit.
    context = handshake_refused_context(why, base)
    error = f"the database refused to record the running handshake: {why}"
    return Verdict(False, context=context, error=error, expected=(TaskState.QUEUED, TaskState.RUNNING))


def _stopped(outcome: Outcome, base: dict[str, Any], expected: tuple[TaskState, ...]) -> Verdict:
    stop = outcome.stop
    assert stop is not None
    common = dict(base)
    if outcome.returncode is not None:  # there was a process to signal
        common.update(signal_sent="SIGTERM", sigkill_sent=stop.sigkill_sent, kill_grace=stop.kill_grace)
    context = stop_context(stop, **common)
    if stop.reason is Reason.EXECUTION_TIMEOUT:
        return Verdict(False, context=context, error=f"execution_timeout of {stop.timeout:g}s exceeded", expected=expected)
    if stop.reason is Reason.WORKER_TERMINATION:
        return Verdict(False, context=context, error=f"worker stopped on {context.metadata['signal']}", expected=expected)
    if stop.reason is Reason.DB_CONNECTION_ERROR:
        return Verdict(False, context=context, error="could not record the running handshake", expected=(TaskState.QUEUED,))
    return Verdict(False, context=context, error="task process never reported running", expected=(TaskState.QUEUED,))


def _before_handshake(outcome: Outcome, final: Final | None, base: dict[str, Any]) -> Verdict:
    """The process died before "running": a pre-execution failure, its kind from how it died."""
    returncode = outcome.returncode
    facts = final.exception if isinstance(final, StartupFailed) else None
    extra: dict[str, Any] = {}
    if facts:
        extra = {
            "exception_type": facts.get("exception_type"),
            "message": facts.get("message"),
            "traceback": facts.get("traceback"),
        }
    if returncode is not None and returncode < 0:
        context = _pre_execution(PreExecutionReason.KILLED, base, **extra)
        return Verdict(False, context=context, error=f"task process killed by {base['signal']} before it ran", expected=(TaskState.QUEUED,))
    context = _pre_execution(PreExecutionReason.ERROR, base, **extra)
    error = f"{facts.get('exception_type')}: {facts.get('message')}" if facts else f"task process exited with {returncode} before it ran"
    return Verdict(False, context=context, error=error, expected=(TaskState.QUEUED,))


def _exception(facts: dict[str, Any], base: dict[str, Any]) -> Verdict:
    metadata = dict(
        base,
        exception_type=facts.get("exception_type"),
        message=facts.get("message"),
        traceback=facts.get("traceback"),
        fingerprint=facts.get("fingerprint"),
    )
    error = facts.get("traceback") or f"{facts.get('exception_type')}: {facts.get('message')}"
    if facts.get("db_connection_error"):
        metadata.pop("fingerprint")
        context = ExecutionContext.of(Reason.DB_CONNECTION_ERROR, Source.WORKER, sqlstate=facts.get("sqlstate"), **metadata)
        return Verdict(False, context=context, error=error)
    if facts.get("reschedule") is not None:
        return Verdict(False, reschedule=float(facts["reschedule"]))
    if facts.get("non_retryable"):
        context = ExecutionContext.of(Reason.NON_RETRYABLE, Source.WORKER, **metadata)
        return Verdict(False, context=context, fingerprint=facts.get("fingerprint"), error=error)
    retry_after = facts.get("retry_after")
    fingerprint = facts.get("fingerprint")
    if retry_after is not None:
        # A task asking to come back later (HTTP 429) is not a bug repeating itself: without a
        # fingerprint it never counts toward a poison streak.
        metadata["retry_after"] = retry_after
        metadata.pop("fingerprint")
        fingerprint = None
    context = ExecutionContext.of(Reason.TASK_EXCEPTION, Source.WORKER, **metadata)
    return Verdict(False, context=context, fingerprint=fingerprint, retry_after=retry_after, error=error)


def _bash_success(outcome: Outcome, base: dict[str, Any]) -> Verdict:
    """A bash task's result: the last non-empty line of its stdout (a string), or None."""
    line = last_stdout_line(outcome.stdout_tail)
    if line is None:
        return Verdict(True, result=None)
    if outcome.stdout_truncated and "\n" not in outcome.stdout_tail.rstrip("\n"):
        # Only the end of the line was kept: it is longer than the captured tail.
        return _invalid_result(
            {"problem": "too_large", "result_type": "str", "max_bytes": outcome.result_max_bytes,
             "detail": f"the last stdout line is longer than the {len(outcome.stdout_tail.encode())} bytes kept of it"},
            base,
        )
    problem = check_result(line, outcome.result_max_bytes)
    if problem is not None:
        return _invalid_result(problem, base)
    return Verdict(True, result=line)


def _invalid_result(problem: dict[str, Any], base: dict[str, Any], expected: tuple[TaskState, ...] = (TaskState.RUNNING,)) -> Verdict:
    """A result that cannot be stored (or a malformed message on the task's channel) fails the
    attempt, charged to the task: never stored. The problem may come from the task itself: the
    platform's own metadata wins over any key of it."""
    where = "<channel>" if problem.get("channel") else "<result>"
    fingerprint = exception_fingerprint(f"invalid_result.{problem.get('problem')}", where, 0)
    context = dataclasses.replace(ExecutionContext.of(Reason.INVALID_RESULT, Source.WORKER), metadata={**problem, **base})
    return Verdict(False, context=context, fingerprint=fingerprint, error=problem_message(problem), expected=expected)


def message_problem(message: dict[str, Any]) -> dict[str, Any] | None:
    """None for a message a task process may send; else what is wrong with it, as invalid_result
    metadata: a type no task sends, a field of the wrong kind."""
    kind = message.get("type")
    if not isinstance(kind, str) or kind not in TASK_MESSAGES:
        return _malformed("unknown_message", "a message of no type a task sends")
    for name in TASK_MESSAGES[kind]:
        if name in message and not isinstance(message[name], dict):
            return _malformed("malformed_message", f"a {kind!r} message whose {name!r} is not an object")
    facts = message.get("exception") if "exception" in TASK_MESSAGES[kind] else None
    facts = facts or {}
    for name in ("retry_after", "reschedule"):
        seconds = facts.get(name)
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0):
            return _malformed("malformed_message", f"a {kind!r} message whose {name} is not a number of seconds")
    if not isinstance(facts.get("fingerprint"), (str, type(None))) or len(facts.get("fingerprint") or "") > 64:
        return _malformed("malformed_message", f"a {kind!r} message whose fingerprint is not a short string")
    if kind == "running" and not isinstance(message.get("pid", 0), int):
        return _malformed("malformed_message", "a 'running' message whose pid is not a number")
    return None


def _malformed(problem: str, detail: str) -> dict[str, Any]:
    return MalformedMessage(problem, detail).problem


def _bash_exit(outcome: Outcome, exit_code: int, base: dict[str, Any]) -> Verdict:
    """bash's own exit status: negative when bash itself died by a signal."""
    metadata = dict(base, exit_code=exit_code)
    if exit_code < 0:
        metadata["signal"] = signal_name(-exit_code)
    if exit_code == -signal.SIGKILL or (exit_code == 128 + signal.SIGKILL and (_oom_grew(outcome) or outcome.killed_by_host_oom)):
        return _resource_exhaustion(outcome, metadata)
    stderr_line = last_line(outcome.stderr_tail)
    fingerprint = bash_fingerprint(exit_code, stderr_line)
    context = ExecutionContext.of(Reason.NONZERO_EXIT, Source.WORKER, stderr_last_line=stderr_line[-500:], **metadata)
    return Verdict(False, context=context, fingerprint=fingerprint, error=f"bash exited with {exit_code}: {stderr_line}")


def _died(outcome: Outcome, final: Final | None, base: dict[str, Any]) -> Verdict:
    """After the handshake, the process ended without an outcome message."""
    returncode = outcome.returncode
    if isinstance(final, Terminated) or (returncode is not None and -returncode in _STOP_SIGNALS):
        # Someone other than the supervisor asked it to stop (a node shutdown, an operator).
        context = ExecutionContext.of(Reason.WORKER_TERMINATION, Source.WORKER, external=True, **base)
        return Verdict(False, context=context, error="task process terminated from outside the worker")
    if returncode == -signal.SIGKILL:
        return _resource_exhaustion(outcome, base)
    if returncode is not None and returncode < 0:
        # A crash in native code (SIGSEGV, SIGABRT, ...): the task's own fault.
        name = base["signal"]
        fingerprint = exception_fingerprint(f"signal.{name}", "<task process>", 0)
        context = ExecutionContext.of(Reason.TASK_EXCEPTION, Source.WORKER, exception_type=name, fingerprint=fingerprint, **base)
        return Verdict(False, context=context, fingerprint=fingerprint, error=f"task process died by {name}")
    if returncode == 0:
        return Verdict(True, result=None)
    fingerprint = exception_fingerprint("exit", "<task process>", returncode or 0)
    context = ExecutionContext.of(Reason.TASK_EXCEPTION, Source.WORKER, exception_type="exit", fingerprint=fingerprint, **base)
    return Verdict(False, context=context, fingerprint=fingerprint, error=f"task process exited with {returncode}")


def _fork_server_died(outcome: Outcome, base: dict[str, Any], expected: tuple[TaskState, ...]) -> Verdict:
    """The worker's fork server died (killed, out of memory) and its task processes with it: the
    platform's failure, never the task's. Before the handshake nothing of the task ran."""
    if not outcome.handshake:
        context = _pre_execution(PreExecutionReason.KILLED, base, fork_server="died")
        return Verdict(False, context=context, error="the worker's fork server died before the task ran", expected=expected)
    context = ExecutionContext.of(Reason.WORKER_LOST, Source.WORKER, fork_server="died", **base)
    return Verdict(False, context=context, error="the worker's fork server died, and its task processes with it", expected=expected)


def _memory_limit_exceeded(outcome: Outcome, base: dict[str, Any], expected: tuple[TaskState, ...]) -> Verdict:
    limit, peak = outcome.memory_limit_mib, outcome.peak_memory_mib
    metadata = dict(base, memory_limit_mib=limit, peak_mib=peak, enforced_by=outcome.memory_enforced_by)
    context = ExecutionContext.of(Reason.MEMORY_LIMIT_EXCEEDED, Source.WORKER, **metadata)
    seen = f" (at least {peak} MiB seen)" if peak is not None else ""
    return Verdict(False, context=context, error=f"the task's processes went past its memory limit of {limit} MiB{seen}", expected=expected)


def oom_counters_matter(returncode: int | None) -> bool:
    """Whether the OOM-kill counters read after an attempt can change its verdict: only when its
    process died by SIGKILL, or is bash saying a command of its did (137)."""
    return returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)


def _resource_exhaustion(outcome: Outcome, metadata: dict[str, Any]) -> Verdict:
    """A SIGKILL the worker did not send. The kernel's OOM killer's, under the task's own limit
    (or with none), says `"oom": "host"`: read from the attempt's own cgroup where it had one,
    else from the counters of the worker's cgroup and of the machine."""
    metadata = dict(metadata)
    metadata.setdefault("signal", "SIGKILL")
    if outcome.oom_kills_after is not None:
        metadata["oom_kill"] = outcome.oom_kills_after
        if outcome.oom_kills_before is not None:
            metadata["oom_kills_during_attempt"] = outcome.oom_kills_after - outcome.oom_kills_before
    if _killed_by_host_oom(outcome):
        metadata["oom"] = "host"
    context = ExecutionContext.of(Reason.RESOURCE_EXHAUSTION, Source.WORKER, **metadata)
    return Verdict(False, context=context, error="task process killed by SIGKILL the worker did not send")


def _killed_by_host_oom(outcome: Outcome) -> bool:
    if outcome.memory_enforced_by == "cgroup":
        return outcome.killed_by_host_oom  # its own cgroup counts exactly its own processes
    machine_before, machine_after = outcome.machine_oom_kills_before, outcome.machine_oom_kills_after
    machine_grew = machine_before is not None and machine_after is not None and machine_after > machine_before
    return outcome.killed_by_host_oom or machine_grew or _oom_grew(outcome)


def _pre_execution(kind: PreExecutionReason, base: dict[str, Any], error: str | None = None, **extra: Any) -> ExecutionContext:
    metadata = dict(base, pre_execution_reason=kind.value, **{k: v for k, v in extra.items() if v is not None})
    if error:
        metadata["error"] = _clip(error, MAX_MESSAGE_CHARS)
    return ExecutionContext.of(Reason.PRE_EXECUTION_FAILURE, Source.WORKER, **metadata)


def _ended_without_outcome(outcome: Outcome) -> bool:
    """The task process exited by itself, unstopped, and said nothing of its outcome. (A line
    left unfinished by a process killed while writing it is no message, and no fault of it.)"""
    exited = outcome.returncode is not None and outcome.returncode >= 0
    return exited and outcome.stop is None and not is_outcome(outcome.final)


def _oom_grew(outcome: Outcome) -> bool:
    before, after = outcome.oom_kills_before, outcome.oom_kills_after
    return before is not None and after is not None and after > before


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _clip_tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]
