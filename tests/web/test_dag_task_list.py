"""The DAG page's list of task definitions is paged: a 1,000-task DAG with deadlines costs the
same queries as a 10-task one, shows TASKS_PER_PAGE rows with a count and previous/next links,
and weighs the retry budgets of the page's tasks only."""
from __future__ import annotations

import pytest

from deadlines.models import DeadlineDefinition
from orchestrator.console.dags import TASKS_PER_PAGE
from orchestrator.models import Task
from tests.api.factories import make_run
from tests.engine.factories import DagFactory
from tests.pages import get_counted

pytestmark = pytest.mark.django_db


def _dag(tasks: int):
    """`tasks` tasks that can each miss the DAG's 400 s deadline (4 tries of 60 s, waits of 30,
    60 and 120 s), and one task deadline on the last task."""
    dag = DagFactory(
        dag_id=f"wide_{tasks}",
        default_args={"retries": 3, "execution_timeout": 60, "retry_delay": 30, "retry_max_delay": 120},
    )
    Task.objects.bulk_create([Task(dag=dag, task_id=f"t{i:04d}", bash_command="true", position=i) for i in range(tasks)])
    DeadlineDefinition.objects.create(dag=dag, reference="dagrun_queued_at", interval=400, callback="notifier:log")
    last = dag.tasks.get(task_id=f"t{tasks - 1:04d}")
    DeadlineDefinition.objects.create(dag=dag, task=last, reference="task_started_at", interval=500, callback="notifier:log")
    return dag


def test_a_1000_task_dag_with_deadlines_costs_the_same_queries_as_a_10_task_one(alice_client):
    counts = []
    for tasks in (10, 1000):
        dag = _dag(tasks)
        n, page = get_counted(alice_client, f"/dags/{dag.dag_id}/")
        counts.append(n)
        assert page.count('<tr data-task="') == min(tasks, TASKS_PER_PAGE)
        assert page.count("can miss") == min(tasks, TASKS_PER_PAGE)  # the page's tasks against the DAG deadline
    assert counts[0] == counts[1], counts


def test_the_task_list_pages_with_a_count_and_links_that_keep_the_grid_page(alice_client):
    dag = _dag(250)
    _, first = get_counted(alice_client, f"/dags/{dag.dag_id}/")
    assert 'id="task-list-pager"' in first
    assert "Tasks 1–100 of 250" in first
    assert '<tr data-task="t0000">' in first
    assert '<tr data-task="t0100">' not in first

    _, last = get_counted(alice_client, f"/dags/{dag.dag_id}/?grid_page=2&tasks_page=3")
    assert "Tasks 201–250 of 250" in last
    assert '<tr data-task="t0249">' in last
    assert '<tr data-task="t0199">' not in last
    # the previous link keeps the grid's page; there is no next page
    assert 'href="?grid_page=2&amp;tasks_page=2#task-list" rel="prev"' in last
    assert 'href="?grid_page=2&amp;tasks_page=4' not in last
    # the last task's own deadline (500 s, fits its 450 s) beside the DAG's, on its page only
    assert "task deadlines[0] (task_started_at + 500 s)" in last
    assert "task_started_at + 500 s" not in first


@pytest.mark.parametrize("raw", ["0", "-1", "abc", "9999", "1" * 40, "%00"])
def test_a_bad_or_stale_tasks_page_shows_a_page_of_tasks(alice_client, raw):
    dag = _dag(150)
    _, page = get_counted(alice_client, f"/dags/{dag.dag_id}/?tasks_page={raw}")
    assert page.count('<tr data-task="') in (100, 50)  # the first page, or the last past the end


def test_a_dag_without_tasks_says_so(alice_client):
    DagFactory(dag_id="empty")
    _, page = get_counted(alice_client, "/dags/empty/")
    assert "No tasks." in page
    assert 'id="task-list-pager"' not in page


def test_the_grids_poll_keeps_the_task_lists_page(alice_client):
    dag = _dag(250)
    make_run(dag)  # a run not finished: the grid polls
    _, page = get_counted(alice_client, f"/dags/{dag.dag_id}/?tasks_page=2")
    assert f'hx-get="/dags/{dag.dag_id}/?tasks_page=2"' in page
    _, page = get_counted(alice_client, f"/dags/{dag.dag_id}/?tasks_page=2&grid_page=3")
    assert f'hx-get="/dags/{dag.dag_id}/?tasks_page=2&amp;grid_page=3"' in page
