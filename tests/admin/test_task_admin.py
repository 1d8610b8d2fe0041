"""The task admin: one task checked against the rest of its DAG, with its own deadline rows."""
from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from deadlines.models import DeadlineDefinition
from orchestrator.models import Dag, Task
from tests.admin.conftest import DEADLINE_ROW, TASK_ROW, errors_of, formset
from tests.specs.conftest import snapshot

pytestmark = pytest.mark.django_db

PIPELINE = """
dag_id: pipeline
timezone: Europe/Amsterdam
tasks:
  - {task_id: extract, python_callable: examples.etl.extract, op_kwargs: {source: x}}
  - {task_id: transform, bash_command: echo t, upstream: [extract], retries: 2}
  - {task_id: load, bash_command: echo l, upstream: [transform]}
"""


@pytest.fixture
def dag(tmp_path) -> Dag:
    path = tmp_path / "pipeline.yaml"
    path.write_text(PIPELINE)
    call_command("import_dags", str(path), stdout=StringIO())
    return Dag.objects.get(dag_id="pipeline")


def task_post(task: Task, deadlines: list[dict] | None = None, **fields: str) -> dict:
    data = {**TASK_ROW, "task_id": task.task_id, "python_callable": task.python_callable, "bash_command": task.bash_command}
    data.update({"upstream": ", ".join(task.upstream), "trigger_rule": task.trigger_rule, "position": str(task.position)})
    data.update({"op_kwargs": "{}" if not task.op_kwargs else '{"source": "x"}'})
    data.update(fields)
    data.update(formset("deadline_definitions", deadlines or [], DEADLINE_ROW))
    return data


def url(task: Task) -> str:
    return f"/admin/orchestrator/task/{task.pk}/change/"


def test_it_saves_a_task_with_a_deadline(admin_client, dag) -> None:
    """A valid edit is saved; a task deadline row gets the task's DAG and a position."""
    task = dag.tasks.get(task_id="transform")
    deadline = {"reference": "task_started_at", "interval": "600", "callback": "tests.specs.callables.page"}
    response = admin_client.post(url(task), task_post(task, deadlines=[deadline], retries="3", execution_timeout="12.5"))
    assert response.status_code == 302, errors_of(response)
    task.refresh_from_db()
    assert task.args == {"retries": 3, "execution_timeout": 12.5}
    row = DeadlineDefinition.objects.get(task=task)
    assert (row.dag_id, row.reference, row.interval, row.position) == (dag.pk, "task_started_at", 600.0, 0)


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        ({"upstream": "load"}, "cycle: "),
        ({"upstream": "ghost"}, "unknown task &#x27;ghost&#x27;"),
        ({"task_id": "renamed"}, "task &#x27;load&#x27;: upstream: unknown task &#x27;transform&#x27;"),
        ({"bash_command": "", "python_callable": "examples.nowhere.fn"}, "cannot import"),
        ({"trigger_rule": "sometimes"}, "sometimes"),
    ],
    ids=["cycle", "unknown_upstream", "rename_breaks_downstream", "unimportable", "bad_trigger_rule"],
)
def test_it_rejects_a_task_that_breaks_its_dag(admin_client, dag, fields: dict, shown: str) -> None:
    """An edit that would break the DAG's graph or the task itself is shown and not saved."""
    before = snapshot()
    task = dag.tasks.get(task_id="transform")
    response = admin_client.post(url(task), task_post(task, **fields))
    errors_of(response)
    assert shown in response.content.decode()
    assert snapshot() == before


def test_it_rejects_a_dag_level_reference_on_a_task(admin_client, dag) -> None:
    """Task deadlines offer only task references; others are refused."""
    task = dag.tasks.get(task_id="load")
    deadline = {"reference": "dagrun_queued_at", "interval": "60", "callback": "notifier:log"}
    response = admin_client.post(url(task), task_post(task, deadlines=[deadline]))
    assert "dagrun_queued_at" in errors_of(response)
    assert not DeadlineDefinition.objects.exists()


def test_it_adds_a_task_to_a_dag(admin_client, dag) -> None:
    """A new task is checked against its DAG's tasks and then saved."""
    new = Task(dag=dag, task_id="report", bash_command="echo r", upstream=["load"], position=3)
    data = {**task_post(new), "dag": str(dag.pk)}
    response = admin_client.post("/admin/orchestrator/task/add/", data)
    assert response.status_code == 302, errors_of(response)
    assert dag.tasks.get(task_id="report").upstream == ["load"]


def test_it_shows_the_task_page_with_its_overrides(admin_client, dag) -> None:
    """The task page shows its retries override in the typed field and the DAG as read-only."""
    task = dag.tasks.get(task_id="transform")
    page = admin_client.get(url(task)).content.decode()
    assert 'name="retries" value="2"' in page
    assert 'name="dag"' not in page
    assert 'name="deadline_definitions-TOTAL_FORMS"' in page
