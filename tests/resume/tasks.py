"""Task callables of the resume tests (imported by the worker's task processes)."""
from __future__ import annotations

import json
import os
import time
from typing import Any

from examples.resumable import ExportJob
from orchestrator.exceptions import StaleAttempt


def _note(path: str, record: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def checkpoint_then_fail(context: dict[str, Any]) -> Any:
    """Try 1 checkpoints an offset and fails; try 2 returns what it finds."""
    state = context["task_state"]
    if context["try_number"] == 1:
        state.set("offset", 41)
        state.set("scratch", "gone soon")
        state.delete("scratch")
        state.delete("never-there")
        raise RuntimeError("fail after the checkpoint")
    state.set("offset", state.get("offset") + 1)
    return {"offset": state.get("offset"), "items": list(state.items()), "key": context["idempotency_key"]}


def hostile_values(context: dict[str, Any]) -> list[str]:
    """Every refused value raises ValueError in the task and changes nothing."""
    state = context["task_state"]
    refused = []
    for key, value in [
        ("big", "x" * 70000),
        ("set", {1, 2}),
        ("nan", float("nan")),
        ("nul", "a\x00b"),
        ("surrogate", "\ud800"),
        ("", 1),
        ("k" * 251, 1),
        ("nul\x00key", 1),
    ]:
        try:
            state.set(key, value)
        except ValueError as exc:
            refused.append(str(exc)[:60])
    state.set("ok", {"tuple": (1, 2), "text": "ünïcode"})
    return refused


def remember(context: dict[str, Any], path: str) -> str:
    """Notes the state and key it starts with, then sets its run id."""
    state = context["task_state"]
    _note(path, {"try": context["try_number"], "state": dict(state.items()), "key": context["idempotency_key"]})
    state.set("seen_run", context["run_id"])
    return "ok"


def keep_setting(context: dict[str, Any], path: str, seconds: float = 60, hold_after_stale: float = 0) -> None:
    """Sets "step" about every 0.2 s, noting each answer; notes a StaleAttempt and re-raises it
    (after `hold_after_stale` seconds, keeping its worker's slot busy meanwhile)."""
    state = context["task_state"]
    deadline = time.monotonic() + seconds
    step = 0
    while time.monotonic() < deadline:
        step += 1
        try:
            state.set("step", {"pid": os.getpid(), "step": step, "try": context["infrastructure_try_number"]})
        except StaleAttempt as exc:
            _note(path, {"pid": os.getpid(), "event": "stale", "step": step, "error": str(exc)})
            time.sleep(hold_after_stale)
            raise
        _note(path, {"pid": os.getpid(), "event": "set", "step": step, "at": time.time()})
        time.sleep(0.2)


class Export(ExportJob):
    """The example's job, with a short poll for tests."""

    def __init__(self, service_url: str, seconds: float = 6, fail_times: int = 0) -> None:
        super().__init__(seconds=seconds, fail_times=fail_times, poll_interval=0.2, service_url=service_url)


def checkpoint_through_an_outage(context: dict[str, Any], path: str, cut: str) -> str:
    """Sets "a", notes it, waits until the test cut the database (file `cut` exists), then sets
    "b", "a" again and deletes "x", noting how long each took, and ends."""
    state = context["task_state"]
    state.set("x", "to delete")
    state.set("a", 1)
    _note(path, {"event": "before"})
    deadline = time.monotonic() + 30
    while not os.path.exists(cut) and time.monotonic() < deadline:
        time.sleep(0.05)
    for change in (("set", "b", 2), ("set", "a", 3), ("delete", "x", None)):
        started = time.monotonic()
        if change[0] == "set":
            state.set(change[1], change[2])
        else:
            state.delete(change[1])
        _note(path, {"event": change[0], "key": change[1], "took": time.monotonic() - started})
    return "done"


def fill_keys(context: dict[str, Any], n: int) -> dict[str, Any]:
    """Sets n keys, then one more new key (refused past the limit), an existing key again (fine),
    and, after deleting one, a new key in its place (fine)."""
    state = context["task_state"]
    for i in range(n):
        state.set(f"k{i}", i)
    refused = ""
    try:
        state.set("one-too-many", 1)
    except ValueError as exc:
        refused = str(exc)
    state.set("k0", "again")
    state.delete(f"k{n - 1}")
    state.set("in-its-place", True)
    return {"refused": refused, "keys": [key for key, _ in state.items()]}


def new_key_once_told(context: dict[str, Any], path: str) -> str:
    """Waits for `path`, then sets a new key: the store it started with was empty, so only the
    database can say the limit is reached by then."""
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        context["task_state"].set("late", 1)
    except ValueError as exc:
        return str(exc)
    return ""
