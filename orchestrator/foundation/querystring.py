"""Query-string parameters, read the same way by the JSON API and the console's pages.

A parameter is absent or empty (as an HTML form's empty field sends it) → its default;
otherwise its stripped text is converted, and a bad value is a BadRequest naming the
parameter and the value. No text may hold NUL: PostgreSQL can neither store nor compare it.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, time
from datetime import timezone as dt_timezone
from typing import Any

from django.http import QueryDict
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from orchestrator.exceptions import BadRequest

# The JSON schema of any text the API takes: a string without NUL.
NO_NUL = "^[^\\u0000]*$"
TEXT: dict[str, Any] = {"type": "string", "pattern": NO_NUL}

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


def check_text(name: str, value: str) -> None:
    """PostgreSQL cannot store or compare text holding NUL: refuse it up front, naming the field."""
    if "\x00" in value:
        raise BadRequest(f"{name} must not contain the NUL character (\\u0000)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # JSON's "\\ud800" escape decodes to a lone surrogate, which PostgreSQL refuses.
        raise BadRequest(f"{name} must be valid Unicode (no lone surrogate such as \\ud800)") from None


@dataclass(frozen=True)
class Param:
    """One query parameter: its JSON schema (for the API's document) and the parser that enforces it.

    `convert` turns the stripped, non-empty text into the value (raising BadRequest); an
    absent or empty parameter is `default`.
    """

    name: str
    description: str
    schema: dict[str, Any] = field(default_factory=lambda: dict(TEXT))
    convert: Callable[[str], Any] | None = None
    default: Any = None

    def read(self, params: QueryDict, default: Any = ...) -> Any:
        return self.parse(params.get(self.name, ""), default)

    def parse(self, raw: str, default: Any = ...) -> Any:
        """The value of the parameter's text as it arrived (`raw`)."""
        text = raw.strip()
        check_text(self.name, text)
        if not text:
            return self.default if default is ... else default
        return self.convert(text) if self.convert else text


def read_query(params: QueryDict, declared: Iterable[Param]) -> dict[str, Any]:
    """Every declared parameter's value; parameters nobody declared are ignored."""
    return {param.name: param.read(params) for param in declared}


def whole_number(text: str, name: str, maximum: int) -> int:
    """A whole number from 1 to `maximum`; else BadRequest naming the parameter and the value."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= maximum:
        raise BadRequest(f"invalid {name} '{text}': {name} must be a whole number from 1 to {maximum}")
    return value


def one_of(text: str, name: str, allowed: list[str]) -> str:
    """`text` if it is one of `allowed`; else BadRequest naming the parameter, the value and the choices."""
    if text not in allowed:
        raise BadRequest(f"invalid {name} '{text}': expected one of {', '.join(allowed)}")
    return text


def integer(name: str, description: str, *, maximum: int, default: int) -> Param:
    schema = {"type": "integer", "minimum": 1, "maximum": maximum, "default": default}
    return Param(name, description, schema, lambda text: whole_number(text, name, maximum), default)


def choice(name: str, description: str, values: Iterable[str]) -> Param:
    allowed = [str(value) for value in values]
    return Param(name, description, {"type": "string", "enum": allowed}, lambda text: one_of(text, name, allowed), "")


def string(name: str, description: str) -> Param:
    return Param(name, description, dict(TEXT), None, "")


def parse_since(raw: str) -> datetime:
    """An ISO 8601 date or date-time; naive means UTC.

    A '+' of an offset that arrived unescaped in a query string was decoded as a space:
    it is put back before giving up.
    """
    candidates = [raw]
    if " " in raw:
        head, _, tail = raw.rpartition(" ")
        candidates.append(f"{head}+{tail}")
    for candidate in candidates:
        try:
            value = parse_datetime(candidate)
            if value is None:
                day = parse_date(candidate)
                value = datetime.combine(day, time.min) if day else None
            if value is not None:
                return _in_range(value if timezone.is_aware(value) else value.replace(tzinfo=dt_timezone.utc))
        except (ValueError, OverflowError):
            continue
    raise BadRequest(f"invalid since '{raw}': expected an ISO 8601 date or date-time, e.g. 2026-01-31T00:00:00Z")


def _in_range(value: datetime) -> datetime:
    """`value` in UTC (PostgreSQL refuses offsets beyond ±15:59, ISO 8601 allows ±23:59), or the
    first or last representable instant when the offset takes it out of range: nothing is
    after 9999-12-31T23:59:59-05:00, which is no reason for an error."""
    try:
        return value.astimezone(dt_timezone.utc)
    except OverflowError:
        return (datetime.max if value.year > 1 else datetime.min).replace(tzinfo=dt_timezone.utc)



def since(description: str) -> Param:
    """`since`: an ISO 8601 date or date-time (`parse_since`)."""
    schema = {"type": "string", "anyOf": [{"format": "date-time"}, {"format": "date"}], "examples": ["2026-01-31", "2026-01-31T00:00:00Z"]}
    return Param("since", description, schema, parse_since)


LIMIT = integer("limit", "How many rows at most.", maximum=MAX_LIMIT, default=DEFAULT_LIMIT)


def parse_limit(params: QueryDict, default: int = DEFAULT_LIMIT) -> int:
    return LIMIT.read(params, default)
