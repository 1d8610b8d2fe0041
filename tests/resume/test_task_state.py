"""context["task_state"] through real workers: kept across attempts, fenced, bounded, and
cleared (or kept) with the task."""
from __future__ import annotations

import json

import pytest

from orchestrator import actions
from orchestrator.documents import run_document
from orchestrator.models import TaskStateEntry
from tests.worker.conftest import instance, settle, trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

T = "tests.resume.tasks."


def _task_doc(run, task_id):
    return next(t for t in run_document(run)["task_instances"] if t["task_id"] == task_id)


def test_it_keeps_the_state_across_a_user_retry(worker, make_dag):
    """Try 1 checkpoints and fails; try 2 reads the checkpoint; the run document serves it and
    each entry says which attempt wrote it last."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "checkpoint_then_fail"}], retries=1)
    run = trigger(dag)
    worker()
    ti = settle(run, "t", ("success", "failed"), timeout=40)
    assert ti.state == "success"
    doc = _task_doc(run, "t")
    assert doc["task_state"] == {"offset": 42}
    last = doc["attempts"][-1]
    assert last["result"]["offset"] == 42 and last["result"]["items"] == [["offset", 42]]
    assert len(last["result"]["key"]) == 32
    entry = TaskStateEntry.objects.get(task_instance=ti, key="offset")
    assert (entry.attempt_token, entry.try_number) == (ti.attempt_token, 2)


def test_it_refuses_hostile_values_with_a_value_error_changing_nothing(worker, make_dag):
    dag = make_dag([{"task_id": "t", "python_callable": T + "hostile_values"}])
    run = trigger(dag)
    worker()
    ti = settle(run, "t", ("success", "failed"), timeout=40)
    assert ti.state == "success", ti.attempts.last().stderr
    refused = ti.attempts.last().result
    assert len(refused) == 8
    assert any("65536" in text or "bytes" in text for text in refused)
    assert _task_doc(run, "t")["task_state"] == {"ok": {"tuple": [1, 2], "text": "ünïcode"}}


def test_clear_empties_the_state_and_changes_the_key_unless_kept(worker, make_dag, tmp_path, admin_user):
    notes = tmp_path / "notes.jsonl"
    dag = make_dag([{"task_id": "t", "python_callable": T + "remember", "op_kwargs": {"path": str(notes)}}])
    run = trigger(dag)
    worker()
    settle(run, "t", ("success",), timeout=40)
    actions.clear(instance(run, "t"), admin_user, keep_task_state=True)
    settle(run, "t", ("success",), timeout=40)
    assert _task_doc(run, "t")["task_state"] == {"seen_run": run.run_id}
    actions.clear(instance(run, "t"), admin_user)
    assert _task_doc(run, "t")["task_state"] == {}
    settle(run, "t", ("success",), timeout=40)
    seen = [json.loads(line) for line in notes.read_text().splitlines()]
    assert [s["state"] for s in seen] == [{}, {"seen_run": run.run_id}, {}]
    assert seen[0]["key"] == seen[1]["key"] != seen[2]["key"]
    # A new run starts empty, with a key of its own.
    other = trigger(dag)
    settle(other, "t", ("success",), timeout=40)
    assert json.loads(notes.read_text().splitlines()[-1])["state"] == {}
    assert json.loads(notes.read_text().splitlines()[-1])["key"] not in {s["key"] for s in seen}


