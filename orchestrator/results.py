"""A task's result: what makes one valid, and how a bash task's is read. Pure (no Django).

The task process checks a python task's return value here before it reports it, and the worker
checks a bash task's last stdout line, so that what reaches the database is always JSON the
database can store (PostgreSQL's jsonb refuses NUL and lone surrogates) and never larger than
`ORCHESTRATOR_RESULT_MAX_BYTES`. A result that fails the check fails its attempt as
`application/invalid_result`, with the problem as the failure's metadata, and nothing is stored.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# Not a problem's metadata key: the text of a result is never copied into a failure.
_SHOWN_CHARS = 200


def check_result(value: Any, max_bytes: int) -> dict[str, Any] | None:
    """None when `value` may be stored as a result; else what is wrong, as failure metadata.

    Text that the database cannot hold (NUL) is refused here rather than cleaned: a result is
    data a downstream task reads, and changing it silently would be worse than failing.
    """
    try:
        encoded = json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:  # a ValueError too: caught first
        return {"problem": "invalid_unicode", "result_type": type(value).__name__,
                "detail": "a string holds a lone surrogate, which is not valid UTF-8"}
    except (TypeError, ValueError, RecursionError) as exc:
        return {
            "problem": "not_json",
            "result_type": type(value).__name__,
            "detail": _clip(f"{type(exc).__name__}: {exc}"),
        }
    where = _nul_at(value)
    if where is not None:
        return {"problem": "nul_character", "result_type": type(value).__name__,
                "detail": f"the NUL character (\\u0000) at {where}: the database cannot store it"}
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


def _nul_at(value: Any) -> str | None:
    """Where a string (or key) of a JSON value holds NUL, as a path; None if nowhere."""
    stack: list[tuple[Any, str]] = [(value, "$")]
    while stack:  # iterative: a deep value must not exhaust the stack
        item, where = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return where
        elif isinstance(item, Mapping):
            for key, child in item.items():
                if isinstance(key, str) and "\x00" in key:
                    return f"{where} (a key)"
                stack.append((child, f"{where}.{key}"))
        elif isinstance(item, (list, tuple)):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
    return None


def _clip(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."
