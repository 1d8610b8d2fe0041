"""A task queued where no live worker listens says so: in its run document (`waiting_for` kind
`queue`), on the run and task pages and in `trigger_dag --wait`'s progress line; it stays
`queued` and runs as soon as a worker reads its queue."""
from __future__ import annotations

import os
import signal

import pytest

from orchestrator.data.queue_listeners import is_live, listened
from orchestrator.management.commands.trigger_dag import progress_of
from orchestrator.operations.documents import run_document
from tests.conftest import wait_until
from tests.worker.conftest import instance, settle, trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]


def _waiting(run, task_id):
    doc = run_document(run)
    return next(t["waiting_for"] for t in doc["task_instances"] if t["task_id"] == task_id)


def test_a_task_on_a_queue_nobody_reads_says_so_until_a_worker_comes(worker, make_dag, queue_name, client, admin_user, settings):
    settings.ORCHESTRATOR_HEARTBEAT_INTERVAL = 0.2
    dag = make_dag([{"task_id": "t", "bash_command": "echo hi"}])
    run = trigger(dag)
    settle(run, "t", ("queued",))
    waiting = _waiting(run, "t")
    assert waiting["kind"] == "queue"
    assert waiting["name"] == queue_name
    assert waiting["since"]
    assert instance(run, "t").state == "queued"
    assert f"waiting: no worker listens on queue '{queue_name}'" in progress_of(run).text()
    client.force_login(admin_user)
    run_page = client.get(f"/dags/{dag.dag_id}/runs/{run.run_id}/").content.decode()
    assert f"no worker listens on queue &#x27;{queue_name}&#x27;" in run_page
    task_page = client.get(f"/dags/{dag.dag_id}/runs/{run.run_id}/tasks/t").content.decode()
    assert f"no worker listens on queue &#x27;{queue_name}&#x27;" in task_page
    worker()
    settle(run, "t", ("success",))
    assert "waiting:" not in progress_of(run).text()


def test_the_queue_of_a_worker_that_died_is_unattended_within_two_heartbeat_intervals(worker, make_dag, queue_name, settings):
    settings.ORCHESTRATOR_HEARTBEAT_INTERVAL = 0.2
    dag = make_dag([{"task_id": "t", "bash_command": "echo hi"}])
    proc = worker()
    wait_until(lambda: _listened_now(queue_name), timeout=60, message="the worker to listen")
    os.kill(proc.pid, signal.SIGSTOP)  # as good as dead: it beats no more
    try:
        wait_until(lambda: not _listened_now(queue_name), timeout=0.2 * 2 + 1, interval=0.02, message="its queue to be unattended")
        run = trigger(dag)
        settle(run, "t", ("queued",))
        assert _waiting(run, "t")["name"] == queue_name
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def _listened_now(queue: str) -> bool:
    from orchestrator.data.queue_listeners import listened_queues

    return queue in (listened_queues() or set())


def test_liveness_is_the_last_heartbeat_within_one_and_a_half_intervals():
    from datetime import datetime, timedelta, timezone

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert is_live(now - timedelta(seconds=7.5), now, 5)
    assert not is_live(now - timedelta(seconds=7.6), now, 5)
    assert not is_live(None, now, 5)
    assert listened([(now, ["a", "b"]), (now - timedelta(seconds=60), ["c"])], now, 5) == {"a", "b"}
