"""The memory keys in DAG specs: checked at import (errors name the file, DAG, task and field),
in the admin with the same rules, exported and imported back unchanged."""
from __future__ import annotations

from io import StringIO

import pytest
import yaml
from django.core.management import CommandError, call_command

from orchestrator.models import Dag
from tests.admin.conftest import dag_post, errors_of
from tests.specs.conftest import spec_file  # noqa: F401,F811  a fixture

pytestmark = pytest.mark.django_db


def _spec(task: dict, **default_args) -> dict:
    return {"dag_id": "mem", "default_args": default_args, "tasks": [{"task_id": "load", "bash_command": "true", **task}]}


def _import(path) -> str:
    out = StringIO()
    call_command("import_dags", str(path), stdout=out)
    return out.getvalue()


@pytest.mark.parametrize(
    ("task", "default_args", "field", "fragment"),
    [
        ({"memory_limit": 8}, {}, "tasks[0].memory_limit", ">= 16"),
        ({"memory_limit": "2GiB"}, {}, "tasks[0].memory_limit", "whole number of MiB"),
        ({"memory_limit": True}, {}, "tasks[0].memory_limit", "whole number of MiB"),
        ({"memory_limit": 64, "memory_limit_on_retry": [128, 128]}, {}, "tasks[0].memory_limit_on_retry", "grow strictly"),
        ({"memory_limit": 64, "memory_limit_on_retry": [256, 128]}, {}, "tasks[0].memory_limit_on_retry", "grow strictly"),
        ({"memory_limit": 256, "memory_limit_on_retry": [128, 512]}, {}, "tasks[0].memory_limit_on_retry", "start above memory_limit (256 MiB)"),
        ({"memory_limit_on_retry": [128]}, {}, "tasks[0].memory_limit_on_retry", "needs memory_limit"),
        ({"memory_limit": 64, "memory_limit_on_retry": 128}, {}, "tasks[0].memory_limit_on_retry", "a list"),
        ({"memory_limit": 64, "queue_on_oom": "big pool"}, {}, "tasks[0].queue_on_oom", "queue name"),
        ({"memory_limit": 256}, {"memory_limit_on_retry": [128]}, "default_args.memory_limit_on_retry", "start above memory_limit"),
        ({}, {"memory_limit": 4}, "default_args.memory_limit", ">= 16"),
    ],
)
def test_it_refuses_bad_memory_keys_naming_the_file_dag_task_and_field(spec_file, task, default_args, field, fragment):  # noqa: F811
    path = spec_file(_spec(task, **default_args))
    with pytest.raises(CommandError) as info:
        _import(path)
    message = str(info.value)
    assert str(path) in message and "dag 'mem'" in message and field in message and fragment in message, message
    if field.startswith("tasks[0]") or field.endswith("on_retry"):
        assert "task 'load'" in message, message
    assert not Dag.objects.exists()


def test_it_imports_exports_and_imports_the_memory_keys_unchanged(spec_file):  # noqa: F811
    spec = _spec({"memory_limit": 2048, "memory_limit_on_retry": [4096, 8192], "queue_on_oom": "big"}, memory_limit=512)
    _import(spec_file(spec))
    task = Dag.objects.get(dag_id="mem").tasks.get()
    assert task.args == {"memory_limit": 2048, "memory_limit_on_retry": [4096, 8192], "queue_on_oom": "big"}
    out = StringIO()
    call_command("export_dags", "mem", stdout=out)
    (exported,) = yaml.safe_load(out.getvalue())
    assert exported["default_args"]["memory_limit"] == 512
    keys = ("memory_limit", "memory_limit_on_retry", "queue_on_oom")
    assert {key: exported["tasks"][0][key] for key in keys} == {key: spec["tasks"][0][key] for key in keys}
    assert "0 created, 0 updated" in _import(spec_file(out.getvalue(), "exported.yaml"))


def test_the_admin_holds_the_memory_keys_to_the_same_rules(admin_client):
    tasks = [{"task_id": "load", "bash_command": "true", "args": '{"memory_limit": 64, "memory_limit_on_retry": [32]}'}]
    response = admin_client.post("/admin/orchestrator/dag/add/", dag_post(tasks=tasks))
    errors_of(response)
    assert "start above memory_limit" in response.content.decode()
    assert not Dag.objects.exists()
    tasks[0]["args"] = '{"memory_limit": 8}'
    response = admin_client.post("/admin/orchestrator/dag/add/", dag_post(tasks=tasks))
    assert "&gt;= 16" in response.content.decode() and not Dag.objects.exists()
