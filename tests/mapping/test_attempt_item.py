"""Each attempt of a mapped instance keeps the item it was dispatched with: in the run document
(`"item"`, null for a task that is not mapped) and on the task page beside the attempt, also
after its source is cleared with its downstream and everything runs again."""
from __future__ import annotations

from urllib.parse import quote

import pytest

from orchestrator.engine import reporting
from orchestrator.engine.run_advance import advance_run
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.models import DagRun, TaskAttempt, TaskInstance
from orchestrator.operations import actions
from orchestrator.operations.documents import run_document
from retries.states import TaskState
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]

WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)


def _run_queued(run: DagRun, task_id: str, result=None) -> None:
    """Every queued instance of the task claimed, running and succeeded, as a worker reports it."""
    for ti in TaskInstance.objects.filter(dag_run=run, task_id=task_id, state=TaskState.QUEUED).order_by("map_index"):
        assert reporting.claim(ti.pk, ti.attempt_token, WORKER)
        assert reporting.mark_running(ti.pk, ti.attempt_token, pid=1)
        assert reporting.report_success(ti.pk, ti.attempt_token, result=result if result is not None else {"seen": ti.map_item})


def _items(document: dict, task_id: str) -> dict[int, list]:
    """map_index -> the items of its attempts, oldest first."""
    return {t["map_index"]: [a["item"] for a in t["attempts"]] for t in document["task_instances"] if t["task_id"] == task_id}


@pytest.fixture
def run() -> DagRun:
    """source returns [{"path": "a"}, "b"]; each is mapped over it; both have run once."""
    dag = DagFactory(dag_id="mapped", default_args={"retries": 0})
    TaskFactory(dag=dag, task_id="source")
    TaskFactory(dag=dag, task_id="each", upstream=["source"], expand={"item": "results.source"})
    run = create_manual_run(dag)
    advance_run(run.pk)
    _run_queued(run, "source", [{"path": "a"}, "b"])
    _run_queued(run, "each")
    return run


def test_each_attempt_of_a_mapped_instance_has_its_item_and_others_null(run, alice_client):
    document = alice_client.get(f"/api/v1/dags/mapped/runs/{quote(run.run_id, safe='')}").json()
    assert _items(document, "each") == {0: [{"path": "a"}], 1: ["b"]}
    assert _items(document, "source") == {-1: [None]}
    assert document == run_document(DagRun.objects.get(pk=run.pk))


def test_after_the_source_is_cleared_with_its_downstream_each_attempt_says_what_it_ran_with(run, alice):
    actions.clear(TaskInstance.objects.get(dag_run=run, task_id="source"), alice, include_downstream=True)
    _run_queued(run, "source", [{"path": "a"}, "b"])
    _run_queued(run, "each")
    assert DagRun.objects.get(pk=run.pk).state == "success"
    items = _items(run_document(DagRun.objects.get(pk=run.pk)), "each")
    assert items == {0: [{"path": "a"}, {"path": "a"}], 1: ["b", "b"]}
    assert _items(run_document(run), "source") == {-1: [None, None]}


def test_an_attempt_keeps_the_item_it_was_dispatched_with_when_its_instance_gets_another(run, alice):
    """What an expansion over a new list does to an instance: a new item, then a new dispatch."""
    ti = TaskInstance.objects.get(dag_run=run, task_id="each", map_index=1)
    TaskInstance.objects.filter(pk=ti.pk).update(map_item={"new": ["b", 2]})
    actions.clear(TaskInstance.objects.get(pk=ti.pk), alice)  # dispatched again at once
    assert TaskInstance.objects.get(pk=ti.pk).state == TaskState.QUEUED
    assert list(TaskAttempt.objects.filter(task_instance=ti).order_by("attempt_token").values_list("item", flat=True)) == ["b", {"new": ["b", 2]}]


def test_the_task_page_shows_each_attempts_item_beside_it(run, alice, alice_client):
    TaskInstance.objects.filter(dag_run=run, task_id="each", map_index=0).update(map_item="<changed>")
    actions.clear(TaskInstance.objects.get(dag_run=run, task_id="each", map_index=0), alice)
    _run_queued(run, "each")
    page = alice_client.get(f"/dags/mapped/runs/{quote(run.run_id, safe='')}/tasks/each?map_index=0").content.decode()
    shown = page.split('class="attempt-item"><code>')[1:]
    assert [s.split("</code>")[0] for s in shown] == ["{&quot;path&quot;: &quot;a&quot;}", "&quot;&lt;changed&gt;&quot;"]
    source = alice_client.get(f"/dags/mapped/runs/{quote(run.run_id, safe='')}/tasks/source").content.decode()
    assert 'class="attempt-item"' not in source
