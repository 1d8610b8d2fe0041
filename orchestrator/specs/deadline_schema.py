"""Validation of the `deadlines:` lists of a DAG and of its tasks."""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from datetime import date, datetime
from typing import Any
from zoneinfo import ZoneInfo

from deadlines import notifiers
from deadlines.models import DAG_REFERENCES, TASK_REFERENCES, Reference
from orchestrator.foundation.importing import import_object
from orchestrator.specs.value_checks import (
    Problems,
    check_mapping,
    is_number,
    join,
    parse_datetime,
    show,
    unknown_keys,
)

DeadlineSpec = dict[str, Any]

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
DEADLINE_KEYS = ("reference", "interval", "datetime", "callback", "callback_kwargs", "warn", "days", "skip_dates")


def _check_callback(raw: Mapping, kwargs: dict[str, Any], prefix: str, problems: Problems) -> str:
    callback = raw.get("callback")
    path = join(prefix, "callback")
    if not isinstance(callback, str) or not callback:
        problems.add(path, f"must be a dotted path or 'notifier:{'|'.join(notifiers.NOTIFIERS)}', not {show(callback)}")
        return ""
    if callback.startswith(notifiers.PREFIX):
        _check_notifier(callback, kwargs, prefix, problems)
        return callback
    try:
        obj = import_object(callback)
    except ImportError as exc:
        problems.add(path, f"cannot import {callback!r}: {exc}")
    else:
        if not callable(obj):
            problems.add(path, f"{callback!r} is not callable")
    return callback


def _check_notifier(callback: str, kwargs: dict[str, Any], prefix: str, problems: Problems) -> None:
    """A built-in notifier: known, given only keywords it takes, and a webhook only to an allowed host."""
    name = callback[len(notifiers.PREFIX) :]
    notifier = notifiers.NOTIFIERS.get(name)
    if notifier is None:
        names = ", ".join(notifiers.NOTIFIERS)
        problems.add(join(prefix, "callback"), f"unknown notifier {show(name)} (use one of {names})")
        return
    accepted = sorted(set(inspect.signature(notifier).parameters) - {"context", "timeout"})
    for key in kwargs:
        if key not in accepted:
            message = f"not taken by {callback} (it takes {', '.join(accepted)})"
            problems.add(join(prefix, f"callback_kwargs.{key}"), message)
    if name == "webhook":
        try:
            notifiers.allowed_host(kwargs.get("url", ""))
        except notifiers.NotifierError as exc:
            # The notifier's own words: they name the host, never the URL (it may hold a secret).
            problems.add(join(prefix, "callback_kwargs.url"), str(exc))


def _validate_deadline(raw: object, prefix: str, *, task_level: bool, tz: ZoneInfo, problems: Problems) -> DeadlineSpec:
    """One entry of a `deadlines:` list."""
    if not isinstance(raw, Mapping):
        problems.add(prefix, f"must be a mapping, not {show(raw)}")
        return {}
    unknown_keys(raw, DEADLINE_KEYS, prefix, problems)
    allowed = TASK_REFERENCES if task_level else DAG_REFERENCES
    names = ", ".join(ref.value for ref in Reference if ref in allowed)
    reference = raw.get("reference")
    if not isinstance(reference, str) or reference not in {ref.value for ref in allowed}:
        scope = "a task" if task_level else "a DAG"
        problems.add(join(prefix, "reference"), f"must be one of {names} for {scope}; not {show(reference)}")

    interval = raw.get("interval", 0)
    if not is_number(interval) or interval < 0:
        problems.add(join(prefix, "interval"), f"must be a number of seconds >= 0, not {show(interval)}")
        interval = 0

    when: datetime | None = None
    when_text = ""
    if reference == Reference.FIXED_DATETIME:
        if raw.get("datetime") is None:
            problems.add(join(prefix, "datetime"), "is required for fixed_datetime (ISO 8601)")
        else:
            try:
                when, when_text = parse_datetime(raw["datetime"], tz)
            except ValueError as exc:
                problems.add(join(prefix, "datetime"), str(exc))
    elif raw.get("datetime") is not None:
        problems.add(join(prefix, "datetime"), f"is only for reference fixed_datetime, not {show(reference)}")

    kwargs = check_mapping(raw.get("callback_kwargs"), join(prefix, "callback_kwargs"), problems)
    callback = _check_callback(raw, kwargs, prefix, problems)

    warn = raw.get("warn", False)
    if not isinstance(warn, bool):
        problems.add(join(prefix, "warn"), f"must be true or false, not {show(warn)}")

    return {
        "reference": reference,
        "interval": float(interval),
        "datetime": when,
        "datetime_text": when_text,
        "callback": callback,
        "callback_kwargs": kwargs,
        "warn": warn,
        "days": _check_days(raw.get("days"), join(prefix, "days"), problems),
        "skip_dates": _check_skip_dates(raw.get("skip_dates"), join(prefix, "skip_dates"), problems),
    }


def _check_days(raw: object, path: str, problems: Problems) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        problems.add(path, f"must be a list of {', '.join(WEEKDAYS)}; not {show(raw)}")
        return []
    for i, day in enumerate(raw):
        if day not in WEEKDAYS:
            problems.add(f"{path}[{i}]", f"must be one of {', '.join(WEEKDAYS)}; not {show(day)}")
    return list(raw)


def _check_skip_dates(raw: object, path: str, problems: Problems) -> list[str]:
    """ISO dates, normalised to YYYY-MM-DD."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        problems.add(path, f"must be a list of ISO dates, not {show(raw)}")
        return []
    dates: list[str] = []
    for i, value in enumerate(raw):
        if isinstance(value, date) and not isinstance(value, datetime):
            dates.append(value.isoformat())
            continue
        try:
            dates.append(date.fromisoformat(value).isoformat())
        except (TypeError, ValueError):
            problems.add(f"{path}[{i}]", f"must be an ISO date like '2026-12-25', not {show(value)}")
    return dates


def validate_deadlines(
    raw: object, prefix: str, *, task_level: bool, tz: ZoneInfo, problems: Problems
) -> list[DeadlineSpec]:
    """A `deadlines:` list of a DAG (`task_level=False`) or of a task; naive date-times are in `tz`."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        problems.add(prefix, f"must be a list, not {show(raw)}")
        return []
    return [
        _validate_deadline(item, f"{prefix}[{i}]", task_level=task_level, tz=tz, problems=problems)
        for i, item in enumerate(raw)
    ]
