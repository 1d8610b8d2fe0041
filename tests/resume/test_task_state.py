"""context["task_state"] through real workers: kept across attempts, fenced, bounded, and
cleared (or kept) with the task."""
from __future__ import annotations

import json

import pytest

from orchestrator.models import TaskStateEntry
from orchestrator.operations import actions
from orchestrator.operations.documents import run_document
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
    assert last["result"]["offset"] == 42
    assert last["result"]["items"] == [["offset", 42]]
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




def test_a_new_key_past_the_key_limit_raises_a_value_error_changing_nothing(worker, make_dag):
    """ORCHESTRATOR_TASK_STATE_MAX_KEYS: a new key past it is refused by name and value; an
    existing key may still be set, and a key deleted makes room for another."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "fill_keys", "op_kwargs": {"n": 5}}])
    run = trigger(dag)
    worker(ORCHESTRATOR_TASK_STATE_MAX_KEYS=5)
    ti = settle(run, "t", ("success", "failed"), timeout=40)
    assert ti.state == "success", ti.attempts.last().stderr
    result = ti.attempts.last().result
    assert "ORCHESTRATOR_TASK_STATE_MAX_KEYS" in result["refused"]
    assert "5" in result["refused"]
    stored = _task_doc(run, "t")["task_state"]
    assert stored == {"k0": "again", "k1": 1, "k2": 2, "k3": 3, "in-its-place": True}
    assert sorted(result["keys"]) == sorted(stored)


def test_the_database_refuses_a_new_key_past_the_limit_and_the_worker_answers_invalid(worker, make_dag, tmp_path):
    """Keys stored since the attempt started (what its own copy does not know of) count too:
    the worker answers `invalid` and the task's `set` raises, naming the limit."""
    from django.utils import timezone

    go = tmp_path / "go"
    dag = make_dag([{"task_id": "t", "python_callable": T + "new_key_once_told", "op_kwargs": {"path": str(go)}}])
    run = trigger(dag)
    worker(ORCHESTRATOR_TASK_STATE_MAX_KEYS=3)
    ti = settle(run, "t", ("running",), timeout=40)
    for key in ("a", "b", "c"):
        TaskStateEntry.objects.create(
            task_instance=ti, key=key, value=1, written_at=timezone.now(), attempt_token=ti.attempt_token, try_number=1, infrastructure_try_number=0
        )
    go.write_text("go")
    ti = settle(run, "t", ("success", "failed"), timeout=40)
    assert ti.state == "success", ti.attempts.last().stderr
    refused = ti.attempts.last().result
    assert "ORCHESTRATOR_TASK_STATE_MAX_KEYS" in refused
    assert "3" in refused
    assert set(_task_doc(run, "t")["task_state"]) == {"a", "b", "c"}
