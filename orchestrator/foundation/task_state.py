"""`context["task_state"]`: a task's own key/value store, kept across all its attempts.

The task process holds no database or Redis socket: each `set` or `delete` goes as a message
over the pipe it already shares with its supervisor, which stores it fenced by the attempt
token (or, while the database is away, keeps it on the worker's disk until the outcome is
delivered) and answers. The call returns only once that answer says the change is durable.
`get` and `items` read the copy the attempt started with, kept up to date by its own writes.

`validated()` is the one rule for what may be stored; the task process and the supervisor
both apply it, so a bad value changes nothing anywhere.
"""
from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.exceptions import StaleAttempt
from orchestrator.foundation.results import MAX_DEPTH, deeper_than

# Message types on the task process's pipes.
STATE_MESSAGE = "task_state"
STATE_REPLY = "task_state_reply"
# What the supervisor answers.
STORED = "stored"  # in the database
KEPT = "kept"  # on the worker's disk, stored before the attempt's outcome
STALE = "stale"  # the attempt was superseded: nothing changed
INVALID = "invalid"  # refused by validated(): nothing changed

OPS = ("set", "delete", "resume")
MAX_KEY_LENGTH = 250
DEFAULT_MAX_BYTES = 65536
DEFAULT_MAX_KEYS = 1000
RESUME_DECISIONS = ("submitted", "reattached", "already_succeeded", "resubmitted")


def validated(op: str, key: Any, value: Any = None, *, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[str, Any]:
    """The key and the value as they will be stored, or ValueError saying what is wrong.

    A key is a non-empty string of at most 250 characters without NUL; a value must be JSON
    (no NaN or infinity), without NUL or unpaired surrogates (the database cannot store them),
    at most `max_bytes` once encoded as UTF-8 JSON, and nested at most MAX_DEPTH levels deep (what
    the channel to the supervisor carries).
    """
    if op not in OPS:
        raise ValueError(f"task state: unknown operation {op!r}")
    if op == "resume":
        if value not in RESUME_DECISIONS:
            raise ValueError(f"task state: resume decision must be one of {', '.join(RESUME_DECISIONS)}, got {value!r}")
        return "", value
    if not isinstance(key, str) or not key:
        raise ValueError(f"task state: a key must be a non-empty string, got {key!r}")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"task state: key {key[:40]!r}... is {len(key)} characters long; at most {MAX_KEY_LENGTH}")
    if "\x00" in key:
        raise ValueError(f"task state: key {key!r} contains a NUL character")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"task state: key {key!r} is not valid UTF-8 text") from None
    if op == "delete":
        return key, None
    too_deep = f"task state: the value of {key!r} is nested deeper than {MAX_DEPTH} levels"
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except RecursionError:  # only nesting exhausts the encoder's stack
        raise ValueError(too_deep) from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"task state: the value of {key!r} is not JSON-serialisable: {exc}") from None
    if deeper_than(text, MAX_DEPTH):
        raise ValueError(too_deep)
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: neither database can store it
        raise ValueError(f"task state: the value of {key!r} is not valid UTF-8 text (it holds a lone surrogate)") from None
    if len(encoded) > max_bytes:
        raise ValueError(
            f"task state: the value of {key!r} is {len(encoded)} bytes as JSON; at most {max_bytes}"
            " (ORCHESTRATOR_TASK_STATE_MAX_BYTES): keep ids and offsets here, not data"
        )
    if _has_nul(value):
        raise ValueError(f"task state: the value of {key!r} contains a NUL character, which cannot be stored")
    # The stored value is the decoded JSON: what a later attempt reads back, tuples as lists.
    return key, json.loads(encoded)


def too_many_keys(key: str, count: int, max_keys: int) -> ValueError:
    """What `set` raises for a new key when the store already holds `count` >= `max_keys` keys:
    the task's own store and the database (`engine.task_state_store.apply`) say it alike."""
    return ValueError(
        f"task state: cannot add key {key[:40]!r}: it holds {count} keys, at most ORCHESTRATOR_TASK_STATE_MAX_KEYS"
        f" ({max_keys}); set an existing key, or delete keys no longer needed"
    )


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_nul(item) for item in value)
    return False


class TaskStateStore:
    """What a task sees as `context["task_state"]`.

    `request` sends one message to the supervisor and returns its answer (a dict with a
    "status"); it is called under a lock, so threads of a task take turns.
    """

    def __init__(
        self,
        entries: dict[str, Any],
        request: Callable[[dict[str, Any]], dict[str, Any] | None],
        *,
        max_bytes: int,
        max_keys: int = DEFAULT_MAX_KEYS,
    ) -> None:
        self._entries = dict(entries)
        self._request = request
        self._max_bytes = max_bytes
        self.max_keys = max_keys
        self._lock = threading.RLock()

    def get(self, key: str, default: Any = None) -> Any:
        with self._lock:
            return copy.deepcopy(self._entries[key]) if key in self._entries else default

    def items(self) -> Iterator[tuple[str, Any]]:
        with self._lock:
            return iter(copy.deepcopy(sorted(self._entries.items())))

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __repr__(self) -> str:
        return f"TaskStateStore({sorted(self._entries)!r})"

    def set(self, key: str, value: Any) -> None:
        """Store `value` under `key`; returns once the change is durable."""
        key, stored = validated("set", key, value, max_bytes=self._max_bytes)
        with self._lock:
            # The copy the attempt started with is the whole store (no other attempt writes
            # meanwhile): a change kept on the worker's disk is checked here, before it is kept.
            if key not in self._entries and len(self._entries) >= self.max_keys:
                raise too_many_keys(key, len(self._entries), self.max_keys)
            self._send({"op": "set", "key": key, "value": stored})
            self._entries[key] = stored

    def delete(self, key: str) -> None:
        """Remove `key` (nothing happens if it is not there); returns once that is durable."""
        key, _ = validated("delete", key)
        with self._lock:
            self._send({"op": "delete", "key": key})
            self._entries.pop(key, None)

    def record_resume(self, decision: str) -> None:
        """What a resumable task decided on this attempt (orchestrator.resumable)."""
        validated("resume", "", decision)
        with self._lock:
            self._send({"op": "resume", "key": "", "value": decision})

    def _send(self, change: dict[str, Any]) -> None:
        reply = self._request({"type": STATE_MESSAGE, **change}) or {}
        status = reply.get("status")
        if status in (STORED, KEPT):
            return
        if status == STALE:
            raise StaleAttempt("this attempt was superseded by a newer one: its task state was not changed")
        if status == INVALID:
            raise ValueError(reply.get("error") or "task state: refused by the worker")
        raise StaleAttempt("the worker did not answer: this attempt is being stopped and its task state was not changed")


class MemoryTaskState(TaskStateStore):
    """A store that keeps its changes in memory: for calling a task outside a worker (tests,
    a REPL). It applies the same rules."""

    def __init__(self, entries: dict[str, Any] | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self.decisions: list[str] = []
        super().__init__(entries or {}, self._answer, max_bytes=max_bytes, max_keys=max_keys)

    def _answer(self, message: dict[str, Any]) -> dict[str, Any]:
        if message["op"] == "resume":
            self.decisions.append(message["value"])
        return {"status": STORED}
