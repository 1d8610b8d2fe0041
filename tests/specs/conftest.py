"""Helpers for DAG spec tests: a valid baseline spec, spec files on disk, and DB snapshots."""
from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from deadlines.models import DeadlineDefinition
from orchestrator.models import Dag, Task

BASELINE: dict[str, Any] = {
    "dag_id": "settlement",
    "description": "Nightly settlement",
    "schedule": "0 2 * * *",
    "timezone": "Europe/Amsterdam",
    "start_date": "2026-01-01T00:00:00",
    "catchup": False,
    "max_active_runs": 2,
    "default_args": {
        "retries": 3,
        "retry_delay": 2.0,
        "retry_backoff": "exponential",
        "retry_max_delay": 600,
        "retry_jitter": "full",
        "execution_timeout": 30,
        "kill_grace": 5,
        "infrastructure_retry_limit": 5,
        "poison_threshold": 2,
        "queue": "default",
    },
    "deadlines": [
        {
            "reference": "dagrun_queued_at",
            "interval": 3600,
            "callback": "tests.specs.callables.page",
            "callback_kwargs": {"channel": "#data"},
            "warn": True,
            "days": ["mon", "tue", "wed", "thu", "fri"],
            "skip_dates": ["2026-12-25"],
        },
        {"reference": "fixed_datetime", "interval": 0, "datetime": "2026-12-31T23:00:00", "callback": "notifier:log"},
    ],
    "tasks": [
        {
            "task_id": "extract",
            "python_callable": "examples.etl.extract",
            "op_kwargs": {"source": "s3://bucket/x"},
            "deadlines": [{"reference": "task_started_at", "interval": 600, "callback": "notifier:log"}],
        },
        {
            "task_id": "transform",
            "bash_command": "echo {{ logical_date }}",
            "upstream": ["extract"],
            "trigger_rule": "all_done",
            "retries": 5,
        },
        {
            "task_id": "load",
            "python_callable": "tests.specs.callables.CopyOperator",
            "op_kwargs": {"target": "warehouse"},
            "upstream": ["transform"],
        },
    ],
}


@pytest.fixture
def baseline() -> dict[str, Any]:
    """A fresh copy of a valid spec using every field."""
    return copy.deepcopy(BASELINE)


@pytest.fixture
def spec_file(tmp_path: Path) -> Callable[..., Path]:
    """Write a spec (a mapping, a list, or raw text) to a file and return its path."""

    def write(content: Any, name: str = "dag.yaml") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content)
        elif path.suffix == ".json":
            path.write_text(json.dumps(content, indent=2))
        else:
            path.write_text(yaml.safe_dump(content, sort_keys=False))
        return path

    return write


def snapshot() -> list[tuple]:
    """Every stored DAG, task and deadline definition, field by field (ids and timestamps too)."""
    rows: list[tuple] = []
    for model in (Dag, Task, DeadlineDefinition):
        for values in model.objects.order_by("pk").values():
            rows.append((model.__name__, tuple(sorted((k, json.dumps(v, default=str)) for k, v in values.items()))))
    return rows
