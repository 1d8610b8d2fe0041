"""A task's result: what makes one valid, and how a bash task's is read. Pure (no Django).

The task process checks a python task's return value here before it reports it, and the worker
checks a bash task's last stdout line, so that what reaches the database is always JSON the
database can store once the worker has replaced NUL and lone surrogates, and never larger than
`ORCHESTRATOR_RESULT_MAX_BYTES`. A result that fails the check fails its attempt as
`application/invalid_result`, with the problem as the failure's metadata, and nothing is stored.
"""
from __future__ import annotations

import json
from typing import Any

# Not a problem's metadata key: the text of a result is never copied into a failure.
_SHOWN_CHARS = 200


def check_result(value: Any, max_bytes: int) -> dict[str, Any] | None:
    """None when `value` may be stored as a result; else what is wrong, as failure metadata.

    Text the database cannot hold (NUL, a lone surrogate) is still JSON: it is not refused here
    but replaced where the worker builds its report (`sanitise.clean`), which says so in the
    attempt's stderr; the size counts such a character as its replacement.
    """
    try:
        encoded = json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8", "replace")
    except (TypeError, ValueError, RecursionError) as exc:
        return {
            "problem": "not_json",
            "result_type": type(value).__name__,
            "detail": _clip(f"{type(exc).__name__}: {exc}"),
        }
    if len(encoded) > max_bytes:
        return {"problem": "too_large", "result_type": type(value).__name__,
                "size_bytes": len(encoded), "max_bytes": max_bytes,
                "detail": f"{len(encoded)} bytes as JSON, over ORCHESTRATOR_RESULT_MAX_BYTES={max_bytes}"}
    return None


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
