"""Importing a big DAG: the write transaction runs a few statements whatever the number of tasks,
an unchanged file is recognised by its hash without reading the tasks, an edit made elsewhere
(the admin) makes the next import compare again, and a bad task among 10,000 changes nothing."""
from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from bench.big_dag import big_dag
from orchestrator.models import Dag, Task
from orchestrator.specs.importer import load_specs, plan_dag, write_dag
from tests.admin.test_task_admin import task_post
from tests.specs.conftest import snapshot

pytestmark = pytest.mark.django_db

NOOP = "tests.specs.callables.page"


def _big(tasks: int, dag_id: str = "big") -> dict:
    spec = big_dag(dag_id, tasks, width=100)
    for task in spec["tasks"]:
        task["python_callable"] = NOOP
    return spec


def _import(path) -> str:
    out = StringIO()
    call_command("import_dags", str(path), stdout=out)
    return out.getvalue()


def _write_statements(path) -> list[str]:
    """The statements of the write transaction of importing `path` (its reads done before)."""
    plans = [plan_dag(spec) for spec in load_specs([path])]
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        for plan in plans:
            write_dag(plan.spec, plan)
    return [query["sql"] for query in queries.captured_queries]


def test_the_write_transaction_runs_as_many_statements_for_1000_tasks_as_for_10(spec_file):
    counts = []
    for tasks in (10, 1000):
        spec = _big(tasks, f"big_{tasks}")
        path = spec_file(spec, f"big_{tasks}.yaml")
        first = _write_statements(path)
        for task in spec["tasks"]:
            task["op_kwargs"] = {"changed": True}
        changed = _write_statements(spec_file(spec, f"big_{tasks}.yaml"))
        counts.append((len(first), len(changed)))
        assert Task.objects.filter(dag__dag_id=f"big_{tasks}", op_kwargs={"changed": True}).count() == tasks
    assert counts[0] == counts[1], counts


def test_an_unchanged_file_is_recognised_without_reading_its_tasks(spec_file):
    path = spec_file(_big(1000))
    assert "created big" in _import(path)
    before = snapshot()
    with CaptureQueriesContext(connection) as queries:
        assert "unchanged big" in _import(path)
    assert snapshot() == before
    assert not [q["sql"] for q in queries.captured_queries if "orchestrator_task\"" in q["sql"] or "orchestrator_task " in q["sql"]]


def test_an_edit_in_the_admin_makes_the_next_import_compare_and_restore_the_file(spec_file, admin_client):
    path = spec_file(_big(10))
    _import(path)
    task = Task.objects.get(dag__dag_id="big", task_id="hub_0")
    version = Dag.objects.get(dag_id="big").updated_at
    response = admin_client.post(f"/admin/orchestrator/task/{task.pk}/change/", task_post(task, op_kwargs='{"edited": true}'))
    assert response.status_code == 302, response.content.decode()[:2000]
    task.refresh_from_db()
    assert task.op_kwargs == {"edited": True}
    dag = Dag.objects.get(dag_id="big")
    assert dag.spec_hash == ""
    assert dag.updated_at > version
    assert "updated big" in _import(path)
    task.refresh_from_db()
    assert task.op_kwargs == {}


def test_a_bad_task_in_the_middle_of_10000_changes_nothing(spec_file):
    spec = _big(10_000)
    path = spec_file(spec)
    _import(path)
    before = snapshot()
    for task in spec["tasks"]:
        task["op_kwargs"] = {"changed": True}
    spec["tasks"][5000]["python_callable"] = "tests.specs.callables.no_such_function"
    with pytest.raises(CommandError) as raised:
        _import(spec_file(spec))
    assert "tasks[5000].python_callable" in str(raised.value)
    assert snapshot() == before
