"""Task callables the mapping tests run in real task processes."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def files(count: int = 3) -> list[str]:
    return [f"file-{i}.csv" for i in range(count)]


def summary() -> dict[str, Any]:
    return {"n": 3, "label": "three files"}


def load(path: str, context: dict[str, Any]) -> dict[str, Any]:
    return {"path": path, "map_index": context["map_index"]}


def load_slowly(path: str, log: str, seconds: float = 0.2, fail_index: int = -1, context: dict[str, Any] | None = None) -> str:
    """Records its start and end; instance `fail_index` fails on its first try only."""
    assert context is not None
    record = {"map_index": context["map_index"], "try": context["try_number"], "pid": os.getpid()}
    _append(log, {**record, "event": "start", "at": time.time()})
    time.sleep(seconds)
    if context["map_index"] == fail_index and context["try_number"] == 1:
        _append(log, {**record, "event": "fail", "at": time.time()})
        raise ValueError(f"instance {fail_index} fails once")
    _append(log, {**record, "event": "end", "at": time.time()})
    return f"loaded {path}"


def collect(context: dict[str, Any]) -> dict[str, Any]:
    return {"results": context["results"], "map_index": context["map_index"]}


def returns_a_set() -> set[int]:
    return {1, 2}


def returns_too_much() -> str:
    return "x" * 70_000


def _append(path: str, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_log(path: str) -> list[dict[str, Any]]:
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def recorded_instance(item: Any, records: str, seconds: float = 0.0, fail_index: int = -1,
                      context: dict[str, Any] | None = None) -> dict[str, Any]:
    """The fault suite's recorded task, keyed by instance (`task[map_index]`), so that the
    invariant checker sees each instance's attempts; instance `fail_index` fails its first try."""
    from tests.faults.tasks import recorded

    assert context is not None
    instance = {**context, "task_id": f"{context['task_id']}[{context['map_index']}]"}
    recorded(records, seconds, instance, fail_user_tries=1 if context["map_index"] == fail_index else 0)
    return {"item": item, "map_index": context["map_index"]}


def remember_item(item: str, context: dict[str, Any]) -> dict[str, Any]:
    """Keeps its item in its own task state and returns what the state held before."""
    store = context["task_state"]
    before = dict(store.items())
    store.set("item", item)
    store.set("map_index", context["map_index"])
    return {"before": before, "key": context["idempotency_key"]}


def read_list(path: str) -> list[Any]:
    return json.loads(Path(path).read_text())


def sees_source(item: Any, context: dict[str, Any]) -> dict[str, Any]:
    """What a mapped instance was handed of its source's whole result."""
    source = context["results"]["source"]
    return {"item": item, "length": len(source), "last": source[-1]}
