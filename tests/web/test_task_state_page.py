"""The task page's task state (keys, values folded, when and by which attempt each was written)
and the clear dialog's "keep the task state"."""
from __future__ import annotations

import pytest

from orchestrator.engine import task_state_store
from orchestrator.engine.reporting import report_success
from orchestrator.models import TaskStateEntry
from tests.api.factories import chain_dag, instance, make_run, start

pytestmark = pytest.mark.django_db

XSS = "<script>alert('pwned')</script>"


def page(run, task_id: str = "extract") -> str:
    return f"/dags/{run.dag.dag_id}/runs/{run.run_id}/tasks/{task_id}"


@pytest.fixture
def run_with_state():
    run = make_run(chain_dag("etl"))
    ti = start(run, "extract")
    changes = [
        {"op": "set", "key": "remote_job_id", "value": "job-42"},
        {"op": "set", "key": XSS, "value": {"note": XSS, "rows": list(range(40))}},
        {"op": "resume", "key": "", "value": "submitted"},
    ]
    assert task_state_store.apply(ti.pk, ti.attempt_token, changes)
    assert report_success(ti.pk, ti.attempt_token)
    return run


def test_it_shows_each_key_with_its_value_folded_and_who_wrote_it(bob_client, run_with_state):
    html = bob_client.get(page(run_with_state)).content.decode()
    section = html.split('id="task-state"')[1].split("</section>")[0]
    assert "2 keys" in section
    assert "<code>remote_job_id</code>" in section
    assert "<code>&quot;job-42&quot;</code>" in section
    assert "<details><summary><code>" in section  # the long value is folded
    assert 'href="#attempt-1">attempt #1</a>' in section
    assert "user try 1" in section
    assert XSS not in html
    assert "&lt;script&gt;" in section
    assert 'class="badge resume resume-submitted"' in html


def test_the_clear_dialog_offers_to_keep_the_task_state(alice_client, run_with_state):
    html = alice_client.get(page(run_with_state)).content.decode()
    assert 'name="keep_task_state"' in html
    assert "keep the task state" in html


@pytest.mark.parametrize(("keep", "expected"), [("1", {"remote_job_id", XSS}), ("", set())])
def test_clear_from_the_page_keeps_or_empties_the_state(alice_client, run_with_state, keep, expected):
    before = instance(run_with_state, "extract").task_state_epoch
    response = alice_client.post(f"{page(run_with_state)}/clear", {"back": "task", "keep_task_state": keep})
    assert response.status_code in (200, 303)
    ti = instance(run_with_state, "extract")
    assert ti.state in ("none", "scheduled", "queued")  # cleared, and maybe dispatched at once
    assert set(TaskStateEntry.objects.filter(task_instance=ti).values_list("key", flat=True)) == expected
    assert ti.task_state_epoch == before + (0 if keep else 1)


def test_a_task_without_state_shows_no_section(bob_client):
    run = make_run(chain_dag("etl"))
    assert 'id="task-state"' not in bob_client.get(page(run)).content.decode()


def test_it_shows_the_task_state_a_page_of_keys_at_a_time(bob_client):
    """A store of many keys is read a page at a time, with the count of them all and a pager
    (?state_page=N) that keeps the rest of the page's query."""
    from orchestrator.console.taskinstance import STATE_KEYS_PER_PAGE

    run = make_run(chain_dag("etl"))
    ti = start(run, "extract")
    n = STATE_KEYS_PER_PAGE * 2 + 5
    assert task_state_store.apply(ti.pk, ti.attempt_token, [{"op": "set", "key": f"k{i:04d}", "value": i} for i in range(n)])
    html = bob_client.get(page(run)).content.decode()
    section = html.split('id="task-state"')[1].split("</section>")[0]
    assert f"{n} keys" in section
    assert section.count("<tr><th scope=\"row\">") == STATE_KEYS_PER_PAGE
    assert "<code>k0000</code>" in section
    assert f"<code>k{STATE_KEYS_PER_PAGE:04d}</code>" not in section
    assert f"Keys 1–{STATE_KEYS_PER_PAGE} of {n}" in section
    assert "state_page=2" in section
    last = bob_client.get(page(run) + "?state_page=3").content.decode().split('id="task-state"')[1].split("</section>")[0]
    assert last.count("<tr><th scope=\"row\">") == 5
    assert f"<code>k{n - 1:04d}</code>" in last
    assert "state_page=2" in last
    assert "state_page=4" not in last
