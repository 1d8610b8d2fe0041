"""A DAG with run parameters, imported as a spec file is; the personas of the API tests, the
admin's superuser, and the worker tests' real workers."""
from __future__ import annotations

import copy
from typing import Any

import pytest
from django.db import transaction

from orchestrator.models import Dag
from orchestrator.specs.importer import write_dag
from orchestrator.specs.schema import validate_dag
from tests.admin.conftest import admin_client  # noqa: F401
from tests.api.personas import (  # noqa: F401
    alice,
    alice_client,
    anonymous_client,
    bob,
    bob_client,
    fast_password_hasher,
)
from tests.worker.conftest import queue_name, scheduler_settings, worker  # noqa: F401

PARAMS: dict[str, Any] = {
    "team": {"type": "string", "default": "data", "description": "who owns the output"},
    "day_offset": {"type": "integer", "minimum": 0, "maximum": 30, "default": 1},
    "mode": {"type": "string", "enum": ["full", "incremental"]},  # no default: must be given
}

SPEC: dict[str, Any] = {
    "dag_id": "report",
    "schedule": None,
    "params": PARAMS,
    "tasks": [{"task_id": "a", "bash_command": "true"}, {"task_id": "b", "bash_command": "true", "upstream": ["a"]}],
}


def imported(spec: dict[str, Any]) -> Dag:
    """Validate and write one spec as `import_dags` does; fail the test on any problem."""
    normalised, problems = validate_dag(copy.deepcopy(spec))
    assert not problems, problems
    with transaction.atomic():
        write_dag(normalised)
    return Dag.objects.get(dag_id=spec["dag_id"])


@pytest.fixture
def spec() -> dict[str, Any]:
    return copy.deepcopy(SPEC)


@pytest.fixture
def dag(db, spec) -> Dag:
    """`report`: manual only, params team (default), day_offset (default, 0..30), mode (required enum)."""
    return imported(spec)


@pytest.fixture
def scheduled_dag(db, spec) -> Dag:
    """`nightly`: daily, every param with a default."""
    params = {name: value for name, value in spec["params"].items() if "default" in value}
    return imported({**spec, "dag_id": "nightly", "schedule": "@daily", "params": params})
