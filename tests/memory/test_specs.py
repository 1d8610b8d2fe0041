"""The memory keys in DAG specs: checked at import (errors name the file, DAG, task and field),
in the admin with the same rules, exported and imported back unchanged."""
from __future__ import annotations

import json
from io import StringIO

import pytest
import yaml
from django.core.management import CommandError, call_command

from orchestrator.models import Dag
from tests.admin.conftest import DEADLINE_ROW, TASK_ROW, dag_post, errors_of, formset
from tests.specs.conftest import (
    snapshot,
    spec_file,  # noqa: F401  a fixture
)

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
    assert str(path) in message, message
    assert "dag 'mem'" in message, message
    assert field in message, message
    assert fragment in message, message
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
    assert "&gt;= 16" in response.content.decode()
    assert not Dag.objects.exists()


def _change_rows(dag: Dag) -> list[dict]:
    """The DAG page's task rows as a browser sends them back."""
    return [
        {"id": str(task.pk), "dag": str(dag.pk), "task_id": task.task_id, "bash_command": task.bash_command, "args": json.dumps(task.args)}
        for task in dag.tasks.order_by("position")
    ]


def test_the_admin_steps_a_task_up_from_the_dags_default_memory_limit(admin_client):
    """A task's memory_limit_on_retry may rely on default_args' memory_limit, as at import."""
    tasks = [{"task_id": "load", "bash_command": "true", "args": '{"memory_limit_on_retry": [1024, 2048]}'}]
    response = admin_client.post("/admin/orchestrator/dag/add/", dag_post("mem", tasks=tasks, default_args='{"memory_limit": 512}'))
    assert response.status_code == 302, errors_of(response)
    dag = Dag.objects.get(dag_id="mem")
    assert dag.default_args == {"memory_limit": 512}
    assert dag.tasks.get().args == {"memory_limit_on_retry": [1024, 2048]}

    # The task's own page checks it against the same default_args.
    task = dag.tasks.get()
    data = {**TASK_ROW, "task_id": "load", "bash_command": "true", "position": "0", "args": '{"memory_limit_on_retry": [768]}'}
    data.update(formset("deadline_definitions", [], DEADLINE_ROW))
    response = admin_client.post(f"/admin/orchestrator/task/{task.pk}/change/", data)
    assert response.status_code == 302, errors_of(response)
    assert Dag.objects.get(dag_id="mem").tasks.get().args == {"memory_limit_on_retry": [768]}
    data["args"] = '{"memory_limit_on_retry": [256]}'
    response = admin_client.post(f"/admin/orchestrator/task/{task.pk}/change/", data)
    assert "start above memory_limit (512 MiB)" in errors_of(response)
    assert Dag.objects.get(dag_id="mem").tasks.get().args == {"memory_limit_on_retry": [768]}


def test_the_admin_checks_the_tasks_against_default_args_typed_with_them(admin_client):
    """Raising default_args' memory_limit above a task's steps is refused on the same page, and
    nothing changes; so is a default list that does not start above a task's own limit."""
    tasks = [{"task_id": "load", "bash_command": "true", "args": '{"memory_limit_on_retry": [1024]}'}]
    admin_client.post("/admin/orchestrator/dag/add/", dag_post("mem", tasks=tasks, default_args='{"memory_limit": 512}'))
    dag = Dag.objects.get(dag_id="mem")
    before = snapshot()

    response = admin_client.post(f"/admin/orchestrator/dag/{dag.pk}/change/", dag_post("mem", tasks=_change_rows(dag), default_args='{"memory_limit": 2048}'))
    assert "task &#x27;load&#x27;: must start above memory_limit (2048 MiB)" in response.content.decode(), errors_of(response)
    assert snapshot() == before

    rows = _change_rows(dag)
    rows[0]["args"] = '{"memory_limit": 4096}'
    data = dag_post("mem", tasks=rows, default_args='{"memory_limit": 512, "memory_limit_on_retry": [1024]}')
    response = admin_client.post(f"/admin/orchestrator/dag/{dag.pk}/change/", data)
    assert "default_args.memory_limit_on_retry: task &#x27;load&#x27;: must start above memory_limit (4096 MiB)" in errors_of(response)
    assert snapshot() == before
