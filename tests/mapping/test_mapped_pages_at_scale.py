"""The DAG page's grid and a mapped task's page cost the same queries with 1,000 instances as with
10, and with 600 tasks as with 10: the grid pages the tasks and counts a mapped task's
instances by state in the database; the mapped task's page counts them and shows a page."""
from __future__ import annotations

from urllib.parse import quote

import pytest

from orchestrator.console.grid import TASKS_PER_PAGE
from orchestrator.console.mapped import INSTANCES_PER_PAGE
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.models import Task, TaskInstance
from retries.states import TaskState
from tests.engine.factories import DagFactory, TaskFactory
from tests.pages import get_counted

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]


def _mapped_run(width: int, extra_tasks: int = 0):
    """`load` mapped over `width` items, its instances spread over three states, and
    `extra_tasks` plain tasks after it."""
    dag = DagFactory(dag_id=f"mapped_{width}_{extra_tasks}", default_args={"retries": 0})
    TaskFactory(dag=dag, task_id="load", expand={"n": list(range(width))}, position=0)
    Task.objects.bulk_create([Task(dag=dag, task_id=f"t{i}", bash_command="true", position=i + 1) for i in range(extra_tasks)])
    run = create_manual_run(dag)
    instances = TaskInstance.objects.filter(dag_run=run, task_id="load")
    instances.filter(map_index__gte=width // 2).update(state=TaskState.SUCCESS)
    instances.filter(map_index=1).update(state=TaskState.FAILED, infrastructure_try_number=2)
    return dag, run


def test_the_grid_costs_the_same_for_1000_instances_and_600_tasks_as_for_10(alice_client):
    counts = []
    for width, tasks in ((10, 10), (1000, 600)):
        dag, _ = _mapped_run(width, tasks)
        n, page = get_counted(alice_client, f"/dags/{dag.dag_id}/")
        counts.append(n)
        # one cell for the mapped task, coloured by its worst instance, its counts in the title
        assert f'title="load: {width} instances: 1 failed, ' in page
        label = str(width) if width < 1000 else f"{width // 1000}k"  # what a 14 px square holds
        assert f'<i class="mapped">{label}</i>' in page
        assert page.count('data-task-id="') == min(tasks + 1, TASKS_PER_PAGE)
    assert counts[0] == counts[1], counts
    # the second page of the 601 tasks (load, t0 ... t599): the next TASKS_PER_PAGE
    n = TASKS_PER_PAGE
    _, second = get_counted(alice_client, f"/dags/{dag.dag_id}/?grid_page=2")
    assert 'id="grid-pager"' in second
    assert f"Tasks {n + 1}–{2 * n} of 601" in second
    assert f'data-task-id="t{n - 1}"' in second
    assert f'data-task-id="t{2 * n - 1}"' not in second
    assert f'data-task-id="t{n - 2}"' not in second  # on the first page
    _, last = get_counted(alice_client, f"/dags/{dag.dag_id}/?grid_page=9999")  # past the end: the first page
    assert f"Tasks 1–{n} of 601" in last


def test_the_mapped_task_page_costs_the_same_for_1000_instances_as_for_10(alice_client):
    counts = []
    for width in (10, 1000):
        dag, run = _mapped_run(width)
        url = f"/dags/{dag.dag_id}/runs/{quote(run.run_id, safe='')}/tasks/load"
        n, page = get_counted(alice_client, url)
        counts.append(n)
        assert f"{width} instances: 1 failed, {width // 2 - 1} queued, {width // 2} success" in page
        assert page.count("data-map-index=") == min(width, INSTANCES_PER_PAGE)
        assert "Clear the 1 failed" in page
        assert f"Mark all {width} failed" in page
    assert counts[0] == counts[1], counts
    _, second = get_counted(alice_client, f"{url}?state=success&page=2")
    assert "Instances 201–400 of 500 success" in second
    assert 'data-map-index="700"' in second
    assert 'data-map-index="1"' not in second


def test_the_grid_still_shows_a_task_removed_from_the_dag_after_its_tasks(alice_client):
    dag, _ = _mapped_run(3, 2)
    Task.objects.filter(dag=dag, task_id="t0").delete()  # its instance keeps its history, definition null
    _, page = get_counted(alice_client, f"/dags/{dag.dag_id}/")
    rows = [row.split('"')[0] for row in page.split('data-task-id="')[1:]]
    assert sorted(rows[:2]) == ["load", "t1"]
    assert rows[2:] == ["t0"]
