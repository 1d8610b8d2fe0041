"""A report: how one attempt ended, as its worker delivers it to the engine or spools it.

Built once, storable, from what the supervisor saw and what `classify()` made of it
(`report_of`); reduced to a bare failure when the database refuses it (`refused`); written to
the spool and read back from it as JSON (`to_json`, `from_json`: the one place its text form is
known, parsed at that boundary and nowhere else).

Plain dataclasses (`slots=True, frozen=True`), not pydantic, for every type the worker passes
between its processes: the worker, its fork server and its task processes never import the
API's framework and pydantic with it (some 16 MiB a process), a report is built on every attempt
(so no validation per attempt), and what it reads from the spool was written and sealed by a
worker of this platform: parsing it is enough.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from orchestrator.foundation.sanitise import clean, error_text
from orchestrator.worker.classify import Verdict
from retries.context import ExecutionContext
from retries.states import REPORT_SUCCESS_FROM, Reason, Source, TaskState

if TYPE_CHECKING:  # for the annotations only
    from orchestrator.worker.host.supervisor import Supervised


@dataclass(frozen=True, slots=True)
class Output:
    """What the attempt kept of its stdout and stderr."""

    stdout: str = ""
    stderr: str = ""
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class Memory:
    """The memory limit the attempt ran with (MiB), and the most it was seen to use."""

    limit_mib: int | None
    peak_mib: int | None


@dataclass(frozen=True, slots=True)
class Success:
    result: Any = None


@dataclass(frozen=True, slots=True)
class Rescheduled:
    """The task raised Reschedule(seconds): it waits without a slot."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Failure:
    context: ExecutionContext
    fingerprint: str | None
    retry_after: float | None
    error: str | None
    expected: tuple[TaskState, ...]  # the states the attempt may be found in


Ending = Success | Rescheduled | Failure


@dataclass(frozen=True, slots=True)
class Report:
    task_instance_id: int
    token: int
    ended_at: datetime
    output: Output
    ending: Ending
    memory: Memory | None = None
    # Task state changes the database could not take yet, in order: stored before the outcome.
    task_state_changes: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The report as the spool keeps it."""
        record: dict[str, Any] = {
            "task_instance_id": self.task_instance_id,
            "token": self.token,
            "success": isinstance(self.ending, Success),
            "ended_at": self.ended_at.isoformat(),
            "output": {"stdout": self.output.stdout, "stderr": self.output.stderr, "output_truncated": self.output.truncated},
        }
        if self.task_state_changes:
            record["task_state_changes"] = list(self.task_state_changes)
        if self.memory is not None:
            record["memory"] = {"limit_mib": self.memory.limit_mib, "peak_mib": self.memory.peak_mib}
        ending = self.ending
        if isinstance(ending, Success):
            record["result"] = ending.result
        elif isinstance(ending, Rescheduled):
            record["reschedule"] = ending.seconds
        else:
            record.update(
                context=ending.context.to_dict(),
                fingerprint=ending.fingerprint,
                retry_after=ending.retry_after,
                error=ending.error,
                expected=[str(state) for state in ending.expected],
            )
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Report:
        """A spooled report; raises (KeyError, ValueError, TypeError) for one that is none."""
        output, memory = record["output"], record.get("memory")
        return cls(
            task_instance_id=int(record["task_instance_id"]),
            token=int(record["token"]),
            ended_at=datetime.fromisoformat(record["ended_at"]),
            output=Output(str(output["stdout"]), str(output["stderr"]), bool(output["output_truncated"])),
            ending=_ending_from_json(record),
            memory=Memory(memory.get("limit_mib"), memory.get("peak_mib")) if memory else None,
            task_state_changes=tuple(record.get("task_state_changes") or ()),
        )


def _ending_from_json(record: dict[str, Any]) -> Ending:
    if record["success"]:
        return Success(record.get("result"))
    if record.get("reschedule") is not None:
        return Rescheduled(float(record["reschedule"]))
    return Failure(
        context=ExecutionContext.from_dict(record["context"]),
        fingerprint=record.get("fingerprint"),
        retry_after=record.get("retry_after"),
        error=record.get("error"),
        expected=tuple(TaskState(state) for state in record["expected"]),
    )


def report_of(task_instance_id: int, token: int, verdict: Verdict, supervised: Supervised, ended_at: datetime) -> Report:
    """Everything a report says: what is delivered now or spooled for later."""
    outcome = supervised.outcome
    memory = None if outcome.memory_limit_mib is None else Memory(outcome.memory_limit_mib, outcome.peak_memory_mib)
    return sanitised(
        Report(
            task_instance_id=task_instance_id,
            token=token,
            ended_at=ended_at,
            output=Output(supervised.stdout, supervised.stderr, supervised.output_truncated),
            ending=_ending_of(verdict),
            memory=memory,
            task_state_changes=tuple(supervised.task_state_changes),
        )
    )


def _ending_of(verdict: Verdict) -> Ending:
    if verdict.success:
        return Success(verdict.result)
    if verdict.reschedule is not None:
        return Rescheduled(verdict.reschedule)
    assert verdict.context is not None
    error = None if verdict.error is None else str(verdict.error)
    return Failure(verdict.context, verdict.fingerprint, verdict.retry_after, error, tuple(verdict.expected))


def sanitised(report: Report) -> Report:
    """The report with NUL, lone surrogates and invalid UTF-8 replaced in what the task wrote
    (its result, error, output and failure metadata: the one place its text is made storable,
    in both databases), and a note of what was replaced: in a failure's metadata (`sanitised`),
    and for a success (whose context stays null) as a last line of its stderr."""
    replaced: list[str] = []

    def cleaned(name: str, value: Any) -> Any:
        value, changed = clean(value)
        if changed:
            replaced.append(name)
        return value

    ending = report.ending
    if isinstance(ending, Success):
        ending = Success(cleaned("result", ending.result))
    elif isinstance(ending, Failure):
        ending = replace(ending, error=cleaned("error", ending.error))
    output = replace(report.output, stdout=cleaned("output.stdout", report.output.stdout), stderr=cleaned("output.stderr", report.output.stderr))
    if isinstance(ending, Failure):
        ending = _with_metadata(ending, cleaned("context.metadata", ending.context.metadata))
    if not replaced:
        return report
    if isinstance(ending, Failure):
        ending = _with_metadata(ending, {**ending.context.metadata, "sanitised": replaced})
    else:
        note = f"[orchestrator: unstorable characters (NUL, invalid UTF-8) replaced with U+FFFD in: {', '.join(replaced)}]\n"
        stderr = output.stderr + ("" if not output.stderr or output.stderr.endswith("\n") else "\n") + note
        output = replace(output, stderr=stderr)
    return replace(report, output=output, ending=ending)


def _with_metadata(failure: Failure, metadata: dict[str, Any]) -> Failure:
    return replace(failure, context=replace(failure.context, metadata=metadata))


def refused(report: Report, error: BaseException) -> Report:
    """A report the database refused (not for want of a connection), reduced to what can always
    be stored: the same attempt ended as a failure, without the task's text, saying why.

    A success becomes an application failure (what it produced could not be stored: it will not
    be storable the next time either); a failure keeps its classification and loses its text."""
    why = error_text(error)
    kept = {"report_refused": why, "output_dropped": True}
    ending = report.ending
    if isinstance(ending, Failure):
        original = ending.context
        bare = {k: v for k, v in original.metadata.items() if isinstance(v, (int, float, bool)) or k in _PLAIN_METADATA}
        context = ExecutionContext(original.category, original.reason, original.source, {**bare, **kept})
        fingerprint, expected = ending.fingerprint, ending.expected
    else:
        context = ExecutionContext.of(
            Reason.TASK_EXCEPTION, Source.WORKER, exception_type="UnstorableOutcome", message="the outcome could not be stored", **kept
        )
        fingerprint, expected = None, tuple(REPORT_SUCCESS_FROM)
    return Report(
        task_instance_id=report.task_instance_id,
        token=report.token,
        ended_at=report.ended_at,
        output=Output("", "", truncated=True),
        ending=Failure(context, fingerprint, None, why, expected),
    )


# Metadata written by the platform itself (never the task's text): kept in a refused report.
_PLAIN_METADATA = frozenset({"worker_name", "hostname", "exception_type", "signal", "pre_execution_reason", "sqlstate", "during"})
