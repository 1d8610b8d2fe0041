"""A page offers an action's button exactly when the action accepts it: for every task state,
with and without a user-charged failure, the run page's and the task page's buttons are the
actions that the API and the page's own POST accept (each tried, then rolled back)."""
from __future__ import annotations

from datetime import timedelta
from urllib.parse import quote

import pytest
from django.db import transaction
from django.utils import timezone

from orchestrator.engine.dispatch import dispatch
from orchestrator.models import TaskInstance
from retries.states import TaskState
from tests.api.factories import chain_dag, fail, instance, make_run, start

pytestmark = pytest.mark.django_db

ACTIONS = ("clear", "mark_success", "mark_failed", "reclassify")
# A few cells of the matrix spelled out, so that it cannot agree by offering and accepting nothing.
KNOWN = {
    ("failed", True): {"clear", "mark_success", "reclassify"},
    ("running", True): {"mark_failed"},
    ("success", False): {"clear", "mark_failed"},
    ("dead_letter", True): {"clear", "mark_success", "mark_failed", "reclassify"},
}


def task_in(state: str, *, user_failed: bool) -> TaskInstance:
    """`extract` of a new run in `state`, after one user-charged failure or none."""
    run = make_run(chain_dag("etl", retries=5))
    if user_failed:
        fail(run, "extract")
        TaskInstance.objects.filter(task_id="extract").update(next_retry_at=timezone.now() - timedelta(seconds=1))
    if state == TaskState.RUNNING:
        return start(run, "extract")
    if state == TaskState.QUEUED:
        ti = instance(run, "extract")
        if ti.state == TaskState.NONE:
            TaskInstance.objects.filter(pk=ti.pk).update(state=TaskState.SCHEDULED)
            ti = instance(run, "extract")
        assert dispatch(ti, timezone.now())
        return instance(run, "extract")
    TaskInstance.objects.filter(task_id="extract").update(state=state)
    return instance(run, "extract")


def offered(client, url: str, ti: TaskInstance) -> set[str]:
    html = client.get(url).content.decode()
    return {action for action in ACTIONS if f'id="confirm-{action}-{ti.pk}"' in html}


def accepted(client, url: str, *, json: bool) -> bool:
    """Whether the POST succeeds; whatever it changed is rolled back."""
    with transaction.atomic():
        if json:
            response = client.post(url, {}, content_type="application/json")
        else:
            response = client.post(url, {})
        transaction.set_rollback(True)
    assert response.status_code in (200, 303, 409), response.content
    return response.status_code in (200, 303)


@pytest.mark.parametrize("user_failed", [False, True], ids=["no-user-failure", "user-failure"])
@pytest.mark.parametrize("state", [s.value for s in TaskState])
def test_the_buttons_are_what_the_actions_accept(alice_client, state, user_failed):
    ti = task_in(state, user_failed=user_failed)
    assert ti.state == state
    run = ti.dag_run
    run_url = f"/dags/etl/runs/{quote(run.run_id, safe='')}/"
    task_url = f"{run_url}tasks/extract"
    on_run_page = offered(alice_client, run_url, ti)
    on_task_page = offered(alice_client, task_url, ti)
    by_api = {a for a in ACTIONS if accepted(alice_client, f"/api/v1{run_url}tasks/extract/{a}", json=True)}
    by_page = {a for a in ACTIONS if accepted(alice_client, f"{task_url}/{a}", json=False)}
    assert on_run_page == on_task_page == by_api == by_page
    assert instance(run, "extract").state == state  # every try was rolled back
    if (state, user_failed) in KNOWN:
        assert by_api == KNOWN[state, user_failed]


def test_a_viewer_is_offered_nothing(bob_client):
    ti = task_in(TaskState.FAILED, user_failed=True)
    run_url = f"/dags/etl/runs/{quote(ti.dag_run.run_id, safe='')}/"
    assert offered(bob_client, run_url, ti) == set()
    assert offered(bob_client, f"{run_url}tasks/extract", ti) == set()


BULK = [(name, scope) for name in ACTIONS for scope in ("all", "failed")]


def test_a_mapped_tasks_bulk_buttons_are_what_the_actions_accept(alice_client):
    """A bulk button is offered when the action accepts at least one instance of its scope:
    a failed instance with no user-charged failure offers no reclassify."""
    from orchestrator.engine.run_advance import advance_run_now
    from orchestrator.engine.run_creation import create_manual_run
    from tests.engine.factories import DagFactory, TaskFactory

    dag = DagFactory(dag_id="files", default_args={"retries": 0})
    TaskFactory(dag=dag, task_id="load_file", expand={"path": ["a", "b", "c"]})
    run = create_manual_run(dag)
    advance_run_now(run.pk)  # expands the mapped task
    assert TaskInstance.objects.filter(dag_run=run, map_index=2).exists()
    for map_index, state in enumerate(["failed", "success", "none"]):
        TaskInstance.objects.filter(dag_run=run, task_id="load_file", map_index=map_index).update(state=state)
    url = f"/dags/files/runs/{quote(run.run_id, safe='')}/tasks/load_file"
    html = alice_client.get(url).content.decode()
    offered = {(name, scope) for name, scope in BULK if f'id="confirm-{name}-{scope}"' in html}
    assert ("reclassify", "failed") not in offered
    assert ("clear", "failed") in offered
    for name, scope in BULK:
        with transaction.atomic():
            response = alice_client.post(f"{url}/{name}", {"back": "task", "scope": scope, "confirmed": "1"})
            transaction.set_rollback(True)
        assert (response.status_code == 303) == ((name, scope) in offered), (name, scope, response.status_code)
