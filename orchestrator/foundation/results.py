"""A task's result: what makes one valid, and how a bash task's is read. Pure (no Django).

The task process checks a python task's return value here before it reports it, and the worker
checks a bash task's last stdout line, so that what reaches the database is always JSON the
database can store once the worker has replaced NUL and lone surrogates, and never larger than
`ORCHESTRATOR_RESULT_MAX_BYTES`, nor nested deeper than MAX_DEPTH. A result that fails the
check fails its attempt as `application/invalid_result`, with the problem as the failure's
metadata, and nothing is stored. The worker checks a python task's result again when it reads
it: the task process is not trusted to have checked it.
"""
from __future__ import annotations

import json
import re
from typing import Any

# Not a problem's metadata key: the text of a result is never copied into a failure.
_SHOWN_CHARS = 200
# How deep a result (a task state value too) may nest: `[]` is one level, `[[]]` two.
MAX_DEPTH = 64

# A JSON string, escapes and all; an unterminated one runs to the end of the text. It always
# matches where it starts (the closing quote is optional), so the scan never backtracks.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?')
_BRACKET = re.compile(r"[\[\]{}]")


def check_result(value: Any, max_bytes: int) -> dict[str, Any] | None:
    """None when `value` may be stored as a result; else what is wrong, as failure metadata.

    Text the database cannot hold (NUL, a lone surrogate) is still JSON: it is not refused here
    but replaced where the worker builds its report (`sanitise.clean`), which says so in the
    attempt's stderr; the size counts such a character as its replacement.
    """
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except RecursionError:  # only nesting exhausts the encoder's stack
        return _too_deep(value)
    except (TypeError, ValueError) as exc:
        return {
            "problem": "not_json",
            "result_type": type(value).__name__,
            "detail": _clip(f"{type(exc).__name__}: {exc}"),
        }
    if deeper_than(text, MAX_DEPTH):
        return _too_deep(value)
    encoded = text.encode("utf-8", "replace")
    if len(encoded) > max_bytes:
        return {"problem": "too_large", "result_type": type(value).__name__,
                "size_bytes": len(encoded), "max_bytes": max_bytes,
                "detail": f"{len(encoded)} bytes as JSON, over ORCHESTRATOR_RESULT_MAX_BYTES={max_bytes}"}
    return None


def deeper_than(text: str, limit: int) -> bool:
    """Whether JSON text nests deeper than `limit` levels: its brackets counted outside its
    strings, in one linear scan that never recurses, so it is safe to ask before decoding text
    from anyone. Text that is not JSON is judged by the same count (a decoder reading it would
    stop at its first error, no deeper)."""
    bare = _STRING.sub("", text)
    if bare.count("[") + bare.count("{") <= limit:
        return False  # not even that many openings: the common case, without a loop
    depth = 0
    for bracket in _BRACKET.findall(bare):
        if bracket in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def _too_deep(value: Any) -> dict[str, Any]:
    return {"problem": "too_deep", "result_type": type(value).__name__, "max_depth": MAX_DEPTH,
            "detail": f"nested deeper than {MAX_DEPTH} levels"}  # fmt: skip


def problem_message(problem: dict[str, Any]) -> str:
    """One line for the attempt's error text."""
    return f"invalid result ({problem.get('problem')}): {problem.get('detail')}"


def last_line(stdout: str) -> str | None:
    """A bash task's result: the last non-empty line of its stdout, or None."""
    for line in reversed(stdout.splitlines()):
        if line.strip():
            return line
    return None


def _clip(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."
