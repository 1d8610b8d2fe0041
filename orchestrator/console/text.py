"""How numbers, durations, contexts and output read on the console pages."""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

OUTPUT_HEAD_LINES = 40
OUTPUT_TAIL_LINES = 60


def duration(seconds: float | None) -> str:
    """'850 ms', '42 s', '3 min 05 s', '2 h 04 min', '3 d 4 h'; '' for None."""
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{max(seconds, 0) * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return (end - start) / timedelta(seconds=1)


def attempt_label(try_number: int, max_tries: int) -> str:
    """The user try as people say it: 'attempt 2 of 3' ('not run yet' before the first)."""
    if try_number <= 0:
        return f"not run yet ({max_tries} tr{'y' if max_tries == 1 else 'ies'})"
    return f"attempt {try_number} of {max_tries}"


def cell_text(value: Any) -> str:
    """One context value as table text: strings as they are, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


@dataclass(frozen=True)
class Row:
    key: str
    value: str
    block: bool  # long or multi-line: shown in a <pre>


def context_rows(context: dict[str, Any] | None, *, skip: frozenset[str] = frozenset()) -> list[Row]:
    """An execution context as label/value rows: category, reason, source, then each metadata key."""
    if not context:
        return []
    rows = [Row(key, cell_text(context[key]), False) for key in ("category", "reason", "source", "at") if context.get(key)]
    for key, value in sorted((context.get("metadata") or {}).items()):
        if key in skip or value in (None, "", {}, []):
            continue
        text = cell_text(value)
        rows.append(Row(key, text, "\n" in text or len(text) > 120))
    return rows


@dataclass(frozen=True)
class Excerpt:
    head: str
    tail: str
    omitted_lines: int

    @property
    def whole(self) -> bool:
        return self.omitted_lines == 0


def excerpt(text: str, head: int = OUTPUT_HEAD_LINES, tail: int = OUTPUT_TAIL_LINES) -> Excerpt:
    """The first `head` and last `tail` lines of `text`, and how many lines lie between."""
    lines = text.splitlines(keepends=True)
    if len(lines) <= head + tail:
        return Excerpt(text, "", 0)
    return Excerpt("".join(lines[:head]), "".join(lines[-tail:]), len(lines) - head - tail)


def last_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()
    return ""


def error_summary(context: dict[str, Any] | None, stderr_tail: str = "") -> str:
    """One line saying what went wrong: 'Type: message', else the last stderr line, else the reason."""
    context = context or {}
    metadata = context.get("metadata") or {}
    original = metadata.get("original_context") or {}
    metadata = {**(original.get("metadata") or {}), **metadata}
    kind, message = metadata.get("exception_type"), metadata.get("message")
    if message:
        return f"{kind}: {message}" if kind and kind != "exit" else str(message)
    line = metadata.get("stderr_last_line") or last_line(stderr_tail)
    if line:
        return str(line)
    if metadata.get("note"):
        return f"{context.get('reason', '')}: {metadata['note']}"
    return str(context.get("reason", ""))


def pretty_json(value: Any) -> str:
    """Indented JSON for a <pre> block; templates escape it."""
    if value in (None, {}, []):
        return ""
    return json.dumps(value, indent=2, sort_keys=True, default=str)
