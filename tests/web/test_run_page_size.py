"""The run page of a wide run: one page of its tasks, the count of each state for all of them,
and a cost that does not grow with the run."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orchestrator.console.run import RUN_PAGE_SIZE
from orchestrator.models import DagRun, Task, TaskInstance
from tests.api.factories import make_run
from tests.engine.factories import DagFactory

pytestmark = pytest.mark.django_db


def wide_run(width: int) -> DagRun:
    dag = DagFactory()
    Task.objects.bulk_create([Task(dag=dag, task_id=f"t{i:05d}", bash_command="true", position=i) for i in range(width)])
    run = make_run(dag)
    TaskInstance.objects.filter(dag_run=run, task_id__lt="t00010").update(state="failed")
    return run


def page(run: DagRun, number: int | str | None = None) -> str:
    url = f"/dags/{run.dag.dag_id}/runs/{run.run_id}/"
    return url if number is None else f"{url}?page={number}"


def test_it_shows_one_page_of_tasks_and_the_counts_of_all(alice_client):
    bob_client = alice_client  # an operator: the bulk action shows for failures on any page
    run = wide_run(RUN_PAGE_SIZE * 2 + 5)
    html = bob_client.get(page(run)).content.decode()
    assert f"Tasks 1–{RUN_PAGE_SIZE} of {RUN_PAGE_SIZE * 2 + 5}" in html
    assert "failed 10, none" in html
    assert "t00000" in html
    assert f"t{RUN_PAGE_SIZE:05d}" not in html
    assert "Clear all failed" in html
    last = bob_client.get(page(run, 3)).content.decode()
    assert f"Tasks {RUN_PAGE_SIZE * 2 + 1}–{RUN_PAGE_SIZE * 2 + 5} of" in last
    assert "t00000" not in last
    for bad in ("0", "-1", "x", "99999999999999", "3\x00"):
        assert bob_client.get(page(run, bad)).status_code == 200


def test_its_queries_do_not_grow_with_the_run(bob_client):
    counts = []
    for width in (20, RUN_PAGE_SIZE * 3):
        run = wide_run(width)
        with CaptureQueriesContext(connection) as queries:
            assert bob_client.get(page(run)).status_code == 200
        counts.append(len(queries.captured_queries))
    assert counts[0] == counts[1], counts


def test_it_needs_a_login(anonymous_client):
    run = wide_run(3)
    assert anonymous_client.get(page(run)).status_code == 302
