"""The task state when things go wrong: a superseded attempt that goes on writing, a worker
frozen with SIGSTOP while its successor writes, and a TCP cut between a worker and the database."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from django.db import connection

from orchestrator.engine.scheduler import schedule_once
from orchestrator.models import TaskStateEntry
from tests.conftest import wait_until
from tests.faults.conftest import alive, children_of, task_processes
from tests.faults.invariants import attempts_of
from tests.worker.conftest import instance, settle, trigger
from tests.worker.proxy import TcpProxy
from tests.worker.test_supervisor import _database_url, _through

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

T = "tests.resume.tasks."


def _notes(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _successor_wrote(run) -> TaskStateEntry | None:
    schedule_once()
    ti = instance(run, "t")
    entry = TaskStateEntry.objects.filter(task_instance=ti, key="step").first()
    return entry if entry is not None and ti.attempt_token > 1 and entry.attempt_token == ti.attempt_token else None


def test_a_superseded_attempt_that_goes_on_writing_gets_stale_attempt(worker, make_dag, tmp_path):
    """A worker whose heartbeats stop getting through (as a frozen one's) is presumed lost; its
    task, still running, tries to set the state after the successor wrote it: StaleAttempt, and
    the successor's value stands."""
    notes = tmp_path / "notes.jsonl"
    task = {"path": str(notes), "seconds": 6, "hold_after_stale": 60}  # its slot stays busy: the retry goes elsewhere
    dag = make_dag([{"task_id": "t", "python_callable": T + "keep_setting", "op_kwargs": task}], retries=0)
    run = trigger(dag)
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="1", ORCHESTRATOR_HEARTBEAT_INTERVAL="30", ORCHESTRATOR_HEARTBEAT_TIMEOUT="60")
    first_pid = wait_until(lambda: [n["pid"] for n in _notes(notes) if n["event"] == "set"], timeout=30, message="first sets")[0]
    worker()
    entry = wait_until(lambda: _successor_wrote(run), timeout=30, interval=0.1, message="the successor's write")
    stale = wait_until(lambda: [n for n in _notes(notes) if n["event"] == "stale"], timeout=10, message="StaleAttempt in the old task")
    assert stale[0]["pid"] == first_pid
    assert "superseded" in stale[0]["error"]
    assert entry.value["pid"] != first_pid
    ti = settle(run, "t", ("success", "failed"), timeout=40)
    assert ti.state == "success"
    assert attempts_of(ti) == [("platform", "failed", "worker_lost", 1, 0), ("user", "success", None, 1, 1)]
    final = TaskStateEntry.objects.get(task_instance=ti, key="step")
    assert final.value["pid"] != first_pid
    assert final.attempt_token == ti.attempt_token
    # The old task's sets after its successor started never changed the store.
    successor_start = min(n["at"] for n in _notes(notes) if n["event"] == "set" and n["pid"] != first_pid)
    assert not [n for n in _notes(notes) if n["pid"] == first_pid and n["event"] == "set" and n["at"] > successor_start]


def test_a_frozen_worker_whose_successor_wrote_the_state_changes_nothing(worker, make_dag, tmp_path):
    """SIGSTOP of a worker, its fork server and its task; the task is retried elsewhere and its
    successor writes the state; the frozen task wakes first and sets: StaleAttempt (or it is
    killed before it can even see the answer), and the store keeps the successor's value."""
    notes = tmp_path / "notes.jsonl"
    dag = make_dag([{"task_id": "t", "python_callable": T + "keep_setting", "op_kwargs": {"path": str(notes), "seconds": 6}}], retries=0)
    run = trigger(dag)
    frozen = worker(ORCHESTRATOR_WORKER_CONCURRENCY="1")
    wait_until(lambda: [n for n in _notes(notes) if n["event"] == "set"], timeout=30, message="first sets")
    tasks = task_processes(frozen.pid)
    servers = [p for p in children_of(frozen.pid) if p not in tasks]
    first_pid = _notes(notes)[0]["pid"]
    for pid in [*tasks, *servers, frozen.pid]:
        os.kill(pid, signal.SIGSTOP)
    frozen_at = time.time()
    try:
        worker()
        wait_until(lambda: _successor_wrote(run), timeout=30, interval=0.1, message="the successor's write")
        for pid in tasks:
            os.kill(pid, signal.SIGCONT)  # it sets, and waits for its frozen worker's answer
        time.sleep(0.5)
        os.kill(frozen.pid, signal.SIGCONT)
        wait_until(lambda: not alive(first_pid) or any(n["event"] == "stale" for n in _notes(notes)), timeout=15, message="the old task refused or killed")
    finally:
        for pid in [frozen.pid, *servers, *tasks]:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    wait_until(lambda: not alive(first_pid), timeout=15, message="the old task gone")
    ti = settle(run, "t", ("success", "failed"), timeout=40)
    assert ti.state == "success"
    assert not [n for n in _notes(notes) if n["pid"] == first_pid and n["event"] == "set" and n["at"] > frozen_at]
    final = TaskStateEntry.objects.get(task_instance=ti, key="step")
    assert final.value["pid"] != first_pid
    assert final.attempt_token == ti.attempt_token


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the TCP cut needs the database on a socket")
def test_the_store_through_a_tcp_cut_to_the_database(worker, make_dag, scheduler_settings, tmp_path):
    """Cut off from the database, a worker keeps its task's changes on its disk (set and delete
    return at once), and stores them, in order, before the outcome once the database is back."""
    db = connection.settings_dict
    proxy = TcpProxy(db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432))
    spool = tmp_path / "spool"
    notes, cut = tmp_path / "notes.jsonl", tmp_path / "cut"
    dag = make_dag([{"task_id": "t", "python_callable": T + "checkpoint_through_an_outage", "op_kwargs": {"path": str(notes), "cut": str(cut)}}])
    worker(
        DATABASE_URL=_through(proxy, _database_url()),
        ORCHESTRATOR_HEARTBEAT_TIMEOUT=scheduler_settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT,
        ORCHESTRATOR_REPORT_PATIENCE=1,
        ORCHESTRATOR_SPOOL_DIR=str(spool),
    )
    try:
        run = trigger(dag)
        wait_until(lambda: _notes(notes), timeout=30, message="the first checkpoint")
        ti = instance(run, "t")
        assert dict(TaskStateEntry.objects.filter(task_instance=ti).values_list("key", "value")) == {"x": "to delete", "a": 1}
        proxy.cut()
        cut.touch()
        wait_until(lambda: len(_notes(notes)) == 4, timeout=30, message="the changes made during the cut")
        assert all(n["took"] < 10 for n in _notes(notes)[1:])
        wait_until(lambda: list(spool.rglob("ti-*.json")), timeout=15, message="the outcome spooled")
        spooled = json.loads(next(spool.rglob("ti-*.json")).read_text())
        assert [(c["op"], c["key"]) for c in spooled["task_state_changes"]] == [("set", "b"), ("set", "a"), ("delete", "x")]
        assert dict(TaskStateEntry.objects.filter(task_instance=ti).values_list("key", "value")) == {"x": "to delete", "a": 1}
        for _ in range(5):
            assert not schedule_once().lost
        proxy.restore()
        ti = settle(run, "t", ("success", "failed", "up_for_retry", "scheduled"), timeout=30)
        assert (ti.state, ti.try_number, ti.infrastructure_try_number) == ("success", 1, 0)
        assert dict(TaskStateEntry.objects.filter(task_instance=ti).values_list("key", "value")) == {"a": 3, "b": 2}
        wait_until(lambda: not list(spool.rglob("*.json")), timeout=5, message="the spool emptied")
    finally:
        proxy.cut()
