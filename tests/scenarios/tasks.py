"""Task callables and a cross-process listener for the end-to-end scenarios."""
from __future__ import annotations

import json
import os
import time
from typing import Any

from orchestrator.listeners import hookimpl


class DataProcessingError(Exception):
    pass


def process_data(marker: str, context: dict[str, Any]) -> str:
    """Hangs on its first two physical attempts (to be killed), then raises once, then succeeds."""
    with open(marker, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "try": context["try_number"], "infra": context["infrastructure_try_number"]}) + "\n")
    if context["infrastructure_try_number"] < 2:
        time.sleep(120)
    if context["try_number"] == 1:
        raise DataProcessingError("Invalid data")
    return "processed"


@hookimpl
def on_task_instance_failed(previous_state, task_instance, error, execution_context):
    """Appends every failure's context to $SCENARIO_LISTENER_LOG, from whichever process saw it."""
    with open(os.environ["SCENARIO_LISTENER_LOG"], "a") as f:
        f.write(json.dumps({"task_id": task_instance.task_id, **execution_context.to_dict()}) + "\n")


def always_broken() -> None:
    """The same bug every time: a poisoned task."""
    raise KeyError("customer_id")
