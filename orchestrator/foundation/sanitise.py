"""User text made storable, once, where it enters: what a task or a user wrote may hold NUL,
lone surrogates or bytes that are not UTF-8, and neither database takes all of them
(PostgreSQL's text and jsonb refuse NUL, its driver cannot encode a lone surrogate).

`clean(value)` walks a JSON-like value (dicts, lists, tuples, strings, bytes; keys too) and
replaces each such character with U+FFFD, returning the cleaned value and whether anything was
replaced, so the caller can say so where the value is recorded.

`parse_json(text)` is the one reading of JSON that a user typed or sent (a request body, a
conf on the command line or in a form): it refuses what Python's parser takes but JSON and
both databases do not (NaN, Infinity, a number too large to be finite, an integer longer than
Python converts, nesting deeper than the parser's stack), each as `NotJson` saying why, never
an exception of another kind. Pure: no Django, no database.
"""
from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

REPLACEMENT = "\ufffd"

# NUL and the surrogate code points: a str holding one cannot be stored (or even encoded).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class NotJson(ValueError):
    """Text that is not JSON either database stores; the message says why, in a few words."""


def _refuse_constant(name: str) -> Any:
    raise NotJson(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotJson(f"the number {text[:40]}{'...' if len(text) > 40 else ''} is too large to be finite")
    return value


def _bounded_int(text: str) -> int:
    limit = sys.get_int_max_str_digits() or 4300
    if len(text.lstrip("-")) > limit:
        raise NotJson(f"a number has more than {limit} digits")
    return int(text)


def parse_json(text: str | bytes) -> Any:
    """The value of JSON text, or NotJson saying why it is not JSON that can be stored. NUL and
    lone surrogates in strings are left to the caller, which can name where they are."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite, parse_int=_bounded_int)
    except NotJson:
        raise
    except json.JSONDecodeError as exc:
        raise NotJson(str(exc)) from None
    except UnicodeDecodeError:
        raise NotJson("it is not UTF-8 text") from None
    except RecursionError:
        raise NotJson("it is nested too deeply") from None


def first_not_finite(value: Any, path: str = "") -> str | None:
    """The path of the first float in a JSON-like value that is NaN or infinite (which neither
    JSON nor either database's JSON holds), or None; iterative, like `first_unstorable`."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return where
        elif isinstance(item, dict):
            stack.extend((child, f"{where}.{key}" if where else str(key)) for key, child in item.items())
        elif isinstance(item, (list, tuple)):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
    return None


def unstorable(text: str) -> bool:
    """Whether `text` holds what neither database stores (to refuse it where a user typed it)."""
    return _UNSTORABLE.search(text) is not None


def first_unstorable(value: Any, path: str = "") -> str | None:
    """The path of the first string (or key) in a JSON-like value that holds NUL or a lone
    surrogate (`conf.a[2]`), or None; iterative, so a deep value cannot exhaust the stack."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if unstorable(item):
                return where
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and unstorable(key):
                    return where
                stack.append((child, f"{where}.{key}" if where else str(key)))
        elif isinstance(item, (list, tuple)):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
    return None


def clean_text(text: str) -> tuple[str, bool]:
    """`text` with NUL and lone surrogates replaced; whether any was."""
    cleaned, replaced = _UNSTORABLE.subn(REPLACEMENT, text)
    return cleaned, replaced > 0


def error_text(error: BaseException, limit: int = 500) -> str:
    """`Type: message` of an error, clipped and made storable: what a record says about why the
    database (or anything else) refused it, whatever the message quotes."""
    return clean_text(f"{type(error).__name__}: {error}"[:limit])[0]


def clean(value: Any) -> tuple[Any, bool]:
    """A copy of a JSON-like value that either database can store; whether anything changed.

    Bytes become text (invalid UTF-8 replaced); values other than text and containers (numbers,
    booleans, None, anything else) are returned as they are.
    """
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, (bytes, bytearray)):
        try:
            return clean_text(bytes(value).decode("utf-8"))
        except UnicodeDecodeError:
            return clean_text(bytes(value).decode("utf-8", errors="replace"))[0], True
    if isinstance(value, dict):
        changed = False
        out = {}
        for key, item in value.items():
            new_key, key_changed = clean(key) if isinstance(key, (str, bytes, bytearray)) else (key, False)
            new_item, item_changed = clean(item)
            changed = changed or key_changed or item_changed
            out[new_key] = new_item
        return out, changed
    if isinstance(value, (list, tuple)):
        changed = False
        items = []
        for item in value:
            new_item, item_changed = clean(item)
            changed = changed or item_changed
            items.append(new_item)
        return (items if isinstance(value, list) else tuple(items)), changed
    return value, False
