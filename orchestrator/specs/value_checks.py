"""Checks of single values in a DAG spec, shared by the DAG, task and deadline validators.

Each `check_*` returns the problem as a message, or None when the value is fine.
"""
from __future__ import annotations

import difflib
import inspect
import json
import math
import re
import reprlib
from collections.abc import Callable, Mapping
from datetime import date, datetime
from typing import Any, TypeGuard
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from orchestrator.engine.schedules import PRESETS
from orchestrator.foundation.importing import import_object
from orchestrator.specs.errors import Problem
from retries import memory

IDENTIFIER = re.compile(r"^[A-Za-z0-9_.\-]{1,250}$")
QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,100}$")
SCHEDULE_PRESETS = tuple(PRESETS)  # the presets the scheduler understands
RETRY_BACKOFFS = ("exponential", "fixed")
RETRY_JITTERS = ("full", "equal", "none")


_BOUNDED = reprlib.Repr()
_BOUNDED.maxlevel, _BOUNDED.maxstring, _BOUNDED.maxother = 4, 80, 80
_BOUNDED.maxtuple = _BOUNDED.maxlist = _BOUNDED.maxdict = _BOUNDED.maxset = 10


def show(value: object, limit: int = 80) -> str:
    """A value as it appears in a message: its repr, shortened. A container is shown only to a
    bounded depth and width, so a huge one (a YAML alias bomb) costs nothing to show."""
    text = _BOUNDED.repr(value) if isinstance(value, (list, dict, tuple, set)) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Problems:
    """The problems found in one spec, in the order found."""

    def __init__(self) -> None:
        self.items: list[Problem] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(Problem(path, message))


def join(prefix: str, key: str) -> str:
    """`tasks[1]` + `upstream` -> `tasks[1].upstream`."""
    return f"{prefix}.{key}" if prefix else key


def unknown_keys(raw: Mapping, allowed: tuple[str, ...], prefix: str, problems: Problems) -> None:
    """Reject keys nobody reads: a typo would otherwise silently change nothing."""
    for key in raw:
        if key in allowed:
            continue
        if not isinstance(key, str):
            problems.add(prefix, f"unknown key {show(key)}")
            continue
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (allowed: {', '.join(allowed)})"
        problems.add(join(prefix, key), f"unknown key{hint}")


def is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_jsonable(value: object) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def check_timezone(value: object) -> str | None:
    """The problem with a timezone name, or None when it is a known IANA name."""
    if not isinstance(value, str) or not value:
        return f"must be an IANA timezone name like 'Europe/Amsterdam', not {show(value)}"
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name too long for a file name
        return f"unknown timezone {show(value)}"
    return None


def check_schedule(value: object) -> str | None:
    """The problem with a schedule, or None when it is a 5-field cron, a preset or null."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        return f"must be a cron expression, one of {', '.join(SCHEDULE_PRESETS)}, or null; not {show(value)}"
    if value.startswith("@"):
        if value not in SCHEDULE_PRESETS:
            return f"unknown preset {show(value)} (use one of {', '.join(SCHEDULE_PRESETS)})"
        return None
    # Five fields only: croniter also takes seconds and years, which the scheduler does not mean.
    if len(value.split()) != 5 or not croniter.is_valid(value):
        return f"invalid cron expression {show(value)} (expected 5 fields like '0 2 * * *')"
    return None


def parse_datetime(value: object, tz: ZoneInfo) -> tuple[datetime, str]:
    """An ISO 8601 date-time (naive = `tz`) as an aware datetime and the text it was written as.

    Raises ValueError with a message naming the value.
    """
    if isinstance(value, datetime):
        parsed, text = value, value.isoformat()
    elif isinstance(value, date):
        parsed, text = datetime(value.year, value.month, value.day), value.isoformat()
    elif isinstance(value, str) and value.strip():
        text = value
        try:
            parsed = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"invalid ISO 8601 date-time {show(value)}") from None
    else:
        raise ValueError(f"must be an ISO 8601 date-time like '2026-01-01T00:00:00', not {show(value)}")
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=tz)
    return parsed, text


# Paths already found runnable in this process: a 10,000-task DAG names a few callables
# thousands of times. Only successes are kept, so a fixed module is looked at again.
_RUNNABLE: set[str] = set()


def check_callable(path: object) -> str | None:
    """The problem with a task's python_callable, or None when it imports to something runnable."""
    if not isinstance(path, str) or not path or not any(sep in path for sep in ".:"):
        # A callable lives in a module: a bare name cannot be one.
        return f"must be a dotted path like 'package.module.function', not {show(path)}"
    if path in _RUNNABLE:
        return None
    problem = _callable_problem(path)
    if problem is None:
        _RUNNABLE.add(path)
    return problem


def _callable_problem(path: str) -> str | None:
    try:
        obj = import_object(path)
    except ImportError as exc:
        return f"cannot import {path!r}: {exc}"
    if inspect.isclass(obj):
        if not callable(getattr(obj, "execute", None)):
            return f"class {path!r} has no execute() method"
        return None
    if not callable(obj):
        return f"{path!r} is not callable"
    return None


def _whole_number(value: object) -> str | None:
    if not is_int(value) or value < 0:
        return f"must be a whole number >= 0, not {show(value)}"
    return None


def _seconds(value: object) -> str | None:
    if not is_number(value) or value < 0:
        return f"must be a number of seconds >= 0, not {show(value)}"
    return None


def _timeout(value: object) -> str | None:
    if value is not None and (not is_number(value) or value <= 0):
        return f"must be a number of seconds > 0, or null for none; not {show(value)}"
    return None


def _one_of(choices: tuple[str, ...]) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        return None if value in choices else f"must be one of {', '.join(choices)}; not {show(value)}"

    return check


def _queue(value: object) -> str | None:
    if not isinstance(value, str) or not QUEUE_NAME.match(value):
        return f"must be a queue name of 1-100 letters, digits, '_', '.', ':' or '-'; not {show(value)}"
    return None


def _queue_or_null(value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or not QUEUE_NAME.match(value)):
        return f"must be a queue name of 1-100 letters, digits, '_', '.', ':' or '-', or null; not {show(value)}"
    return None


def _finite_at_least(low: float, *, inclusive: bool) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low or (value == low and not inclusive):
            return f"must be a number of seconds {'>=' if inclusive else '>'} {low:g}, not {show(value)}"
        return None

    return check


# Each default_args key's check: its problem as a message, or None.
ARG_CHECKS: dict[str, Callable[[object], str | None]] = {
    "retries": _whole_number,
    "infrastructure_retry_limit": _whole_number,
    "poison_threshold": _whole_number,
    "retry_delay": _seconds,
    "retry_max_delay": _seconds,
    "kill_grace": _seconds,
    "execution_timeout": _timeout,
    "retry_backoff": _one_of(RETRY_BACKOFFS),
    "retry_jitter": _one_of(RETRY_JITTERS),
    "queue": _queue,
    "queue_on_oom": _queue_or_null,
    "poke_interval": _finite_at_least(1, inclusive=True),  # a wait_for task's checks: at most one a second
    "wait_timeout": _finite_at_least(0, inclusive=False),
    "memory_limit": memory.limit_problem,
    "memory_limit_on_retry": memory.steps_problem,
}


def check_arg(key: str, value: object) -> str | None:
    """The problem with one default_args value, or None."""
    check = ARG_CHECKS.get(key)
    return check(value) if check else None


def check_memory_together(args: Mapping) -> str | None:
    """memory_limit_on_retry against the memory_limit it steps up from (`args`: a task's
    default_args and own keys merged), or None; a value wrong on its own is reported alone."""
    limit, steps = args.get("memory_limit"), args.get("memory_limit_on_retry")
    if memory.limit_problem(limit) or memory.steps_problem(steps):
        return None
    return memory.together_problem(limit, steps)


def check_args(raw: Mapping, keys: tuple[str, ...], prefix: str, problems: Problems, *, task_id: object = None) -> dict[str, Any]:
    """The default_args keys present in `raw`, each checked (a memory key's problem names the
    task, `task_id`, when it is one's own)."""
    args: dict[str, Any] = {}
    for key in keys:
        if key in raw:
            problem = check_arg(key, raw[key])
            if problem and key in memory.MEMORY_KEYS and isinstance(task_id, str):
                problem = f"task {task_id!r}: {problem}"
            if problem:
                problems.add(join(prefix, key), problem)
            args[key] = raw[key]
    return args


def check_mapping(value: object, path: str, problems: Problems, *, reserved: tuple[str, ...] = ()) -> dict[str, Any]:
    """A JSON-able mapping with string keys (op_kwargs, callback_kwargs)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.add(path, f"must be a mapping, not {show(value)}")
        return {}
    for key in value:
        if not isinstance(key, str):
            problems.add(path, f"keys must be strings, not {show(key)}")
        elif key in reserved:
            problems.add(join(path, key), "is reserved (the task gets it from the orchestrator)")
    if not is_jsonable(value):
        problems.add(path, "must hold only JSON values (strings, numbers, booleans, null, lists, mappings)")
    return dict(value)
