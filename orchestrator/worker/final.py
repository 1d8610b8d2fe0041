"""An attempt's final word: the last message of its task process that says how it ended.

Read once from the task's channel (`final_of`, after `classify.message_problem` accepted the
message), or made by the supervisor from a bash task's exit status; `classify()` reads only
these types. Plain dataclasses (`slots=True, frozen=True`), like every type the worker passes
between its processes: the worker and its fork server never import pydantic (it comes with the
API's framework and weighs some 16 MiB a process), and nothing here needs validating twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Succeeded:
    result: Any = None  # what the task returned (checked again by classify)


@dataclass(frozen=True, slots=True)
class Failed:
    exception: dict[str, Any] = field(default_factory=dict)  # `classify.exception_facts`


@dataclass(frozen=True, slots=True)
class InvalidResult:
    problem: dict[str, Any] = field(default_factory=dict)  # what is wrong with its result


@dataclass(frozen=True, slots=True)
class BashExited:
    exit_code: int  # bash's own exit status, seen by the supervisor (never sent by a task)


@dataclass(frozen=True, slots=True)
class StartupFailed:
    exception: dict[str, Any] = field(default_factory=dict)  # before its code could run


@dataclass(frozen=True, slots=True)
class Terminated:
    """It was told to stop by someone other than the supervisor: no outcome of its own."""


Final = Succeeded | Failed | InvalidResult | BashExited | StartupFailed | Terminated
# The finals that carry the task's own outcome.
OUTCOMES = (Succeeded, Failed, InvalidResult, BashExited)


def is_outcome(final: Final | None) -> bool:
    return isinstance(final, OUTCOMES)


def final_of(message: dict[str, Any]) -> Final | None:
    """The final a well-formed channel message says, or None for one that says none ("running",
    a task state change)."""
    kind = message.get("type")
    if kind == "success":
        return Succeeded(message.get("result"))
    if kind == "failure":
        return Failed(message.get("exception") or {})
    if kind == "invalid_result":
        return InvalidResult(message.get("problem") or {})
    if kind == "startup_error":
        return StartupFailed(message.get("exception") or {})
    if kind == "terminated":
        return Terminated()
    return None
