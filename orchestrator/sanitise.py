"""User text made storable, once, where it enters: what a task or a user wrote may hold NUL,
lone surrogates or bytes that are not UTF-8, and neither database takes all of them
(PostgreSQL's text and jsonb refuse NUL, its driver cannot encode a lone surrogate).

`clean(value)` walks a JSON-like value (dicts, lists, tuples, strings, bytes; keys too) and
replaces each such character with U+FFFD, returning the cleaned value and whether anything was
replaced, so the caller can say so where the value is recorded. Pure: no Django, no database.
"""
from __future__ import annotations

import re
from typing import Any

REPLACEMENT = "\ufffd"

# NUL and the surrogate code points: a str holding one cannot be stored (or even encoded).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


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


def clean_fields(record: dict[str, Any], fields: tuple[str, ...]) -> list[str]:
    """Clean the named fields of `record` in place (dotted names reach into dicts); the names of
    those that changed, in the order given."""
    changed = []
    for name in fields:
        *path, last = name.split(".")
        holder: Any = record
        for part in path:
            holder = holder.get(part) if isinstance(holder, dict) else None
        if not isinstance(holder, dict) or last not in holder:
            continue
        cleaned, was_changed = clean(holder[last])
        if was_changed:
            holder[last] = cleaned
            changed.append(name)
    return changed
