"""One worker, many attempts at once: every guarantee of one attempt holds in each slot."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from rq import Queue

from orchestrator.foundation.redis_conn import get_redis
from orchestrator.worker.host.procs import live_members
from tests.conftest import wait_until
from tests.worker.conftest import gone, instance, settle, trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

T = "tests.worker.tasks."


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _most_at_once(records: list[dict]) -> int:
    """The largest number of tasks between their start and end at the same moment."""
    events = sorted((r["at"], 1 if r["event"] == "start" else -1) for r in records)
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def _tasks(count: int, callable_: str, **op_kwargs) -> list[dict]:
    return [{"task_id": f"t{i}", "python_callable": T + callable_, "op_kwargs": op_kwargs} for i in range(count)]


def _finish(run, task_ids, timeout=30.0) -> dict[str, object]:
    return {task_id: settle(run, task_id, ("success", "failed", "dead_letter"), timeout=timeout) for task_id in task_ids}


def test_it_runs_up_to_its_concurrency_at_once_and_leaves_the_rest_in_redis(worker, make_dag, tmp_path, queue_name):
    """Concurrency 3, six 1 s tasks: three run at once, never more, and the other jobs wait in
    Redis for any worker instead of being taken."""
    path = tmp_path / "window.jsonl"
    dag = make_dag(_tasks(6, "window", path=str(path), seconds=1.0))
    run = trigger(dag)
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="3")
    wait_until(lambda: run.task_instances.filter(state="running").count() == 3, timeout=20, message="three running")
    assert Queue(queue_name, connection=get_redis()).count == 3
    tis = _finish(run, [f"t{i}" for i in range(6)])
    assert {ti.state for ti in tis.values()} == {"success"}
    assert _most_at_once(_records(path)) == 3


@pytest.mark.parametrize("kill", ["process", "group"])
def test_a_killed_worker_leaves_no_process_of_its_tasks_and_they_run_again_elsewhere(worker, make_dag, tmp_path, kill):
    """kill -9 of a worker (its main process, or its whole process group) running 8 tasks: within a
    few seconds no process of any task's group is left, grandchildren included; all 8 are found
    as worker_lost, retried on the platform budget by another worker, and never overlap."""
    paths = [tmp_path / f"runs{i}.jsonl" for i in range(8)]  # one per task: `exclusive` looks for its own copies
    dag = make_dag(
        [{"task_id": f"t{i}", "python_callable": T + "guarded_with_child", "op_kwargs": {"path": str(paths[i]), "seconds": 60.0}} for i in range(8)]
    )
    run = trigger(dag)
    doomed = worker(ORCHESTRATOR_WORKER_CONCURRENCY="8")

    def children() -> list[dict]:
        return [r for path in paths for r in _records(Path(str(path) + ".children"))]

    wait_until(lambda: len(children()) == 8, timeout=30, message="8 tasks with children")
    children = children()
    task_pids = [c["task_pid"] for c in children]
    if kill == "group":
        os.killpg(doomed.pid, signal.SIGKILL)
    else:
        os.kill(doomed.pid, signal.SIGKILL)
    wait_until(
        lambda: all(not live_members(pid) for pid in task_pids) and all(not live_members(c["pid"]) and gone(c["pid"]) for c in children),
        timeout=5,
        message="every task group of the killed worker gone",
    )
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="8")
    tis = _finish(run, [f"t{i}" for i in range(8)], timeout=40)
    for ti in tis.values():
        assert (ti.state, ti.try_number, ti.infrastructure_try_number) == ("success", 1, 1)
        first = ti.attempts.order_by("attempt_token").first()
        assert (first.kind, first.context["reason"]) == ("platform", "worker_lost")
    assert all(not r.get("others_alive") for path in paths for r in _records(path) if r["event"] == "start")


def test_sigterm_lets_short_tasks_finish_and_stops_long_ones_for_another_worker(worker, make_dag, tmp_path):
    """SIGTERM with short and long tasks running: the short ones finish within the grace; the
    long ones get on_kill(worker_termination) and run again on another worker (platform budget)."""
    on_kill = tmp_path / "on_kill"
    short = [{"task_id": f"short{i}", "python_callable": T + "window", "op_kwargs": {"path": str(tmp_path / "w"), "seconds": 0.5}} for i in range(3)]
    long = [
        {"task_id": f"long{i}", "python_callable": T + "GracefulSleeper", "op_kwargs": {"seconds": 60, "on_kill_file": f"{on_kill}{i}"}}
        for i in range(3)
    ]
    dag = make_dag(short + long)
    run = trigger(dag)
    stopping = worker(ORCHESTRATOR_WORKER_CONCURRENCY="6")
    wait_until(lambda: run.task_instances.filter(state="running").count() == 6, timeout=20, message="six running")
    stopping.send_signal(signal.SIGTERM)
    assert stopping.wait(timeout=20) == 0
    for i in range(3):
        assert instance(run, f"short{i}").state == "success"
        context = json.loads(Path(f"{on_kill}{i}").read_text())
        assert (context["category"], context["reason"]) == ("infrastructure", "worker_termination")
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="6")
    for i in range(3):
        ti = settle(run, f"long{i}", ("success", "failed"), timeout=30)
        assert (ti.state, ti.try_number, ti.infrastructure_try_number) == ("success", 1, 1)


def test_a_timeout_in_one_slot_leaves_the_others_alone(worker, make_dag):
    """One task runs past its execution_timeout and is killed; its neighbours, including one that
    prints megabytes, succeed with their heartbeats intact."""
    dag = make_dag(
        [
            {"task_id": "slow", "python_callable": T + "sleep_unless_retried", "op_kwargs": {"seconds": 30}, "args": {"execution_timeout": 1, "retries": 0}},
            {"task_id": "chatty", "python_callable": T + "print_a_lot", "op_kwargs": {"megabytes": 20}},
            {"task_id": "quiet", "python_callable": T + "succeed"},
        ]
    )
    run = trigger(dag)
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="4")
    tis = _finish(run, ["slow", "chatty", "quiet"])
    assert tis["slow"].state == "failed"
    assert tis["slow"].last_failure_context["reason"] == "execution_timeout"
    assert (tis["chatty"].state, tis["quiet"].state) == ("success", "success")
    assert tis["chatty"].attempts.get().output_truncated


def test_a_failpoint_fires_only_in_its_own_slot(worker, make_dag):
    """task.before_running for one task: that task's process exits before running (a startup
    error), while the others in the same worker run normally."""
    dag = make_dag(_tasks(4, "succeed"), retries=0)
    run = trigger(dag)
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="4", ORCHESTRATOR_FAILPOINTS="task.before_running@t2=exit:3")
    tis = _finish(run, ["t0", "t1", "t2", "t3"])
    assert tis["t2"].state == "failed"
    assert tis["t2"].last_failure_context["reason"] == "startup_error"
    assert {tis[t].state for t in ("t0", "t1", "t3")} == {"success"}


def test_a_task_that_uses_django_models_gets_its_own_connection(worker, make_dag):
    dag = make_dag([{"task_id": f"db{i}", "python_callable": T + "count_dags"} for i in range(4)])
    run = trigger(dag)
    worker(ORCHESTRATOR_WORKER_CONCURRENCY="4")
    tis = _finish(run, [f"db{i}" for i in range(4)])
    assert [ti.attempts.get().result for ti in tis.values()] == [1, 1, 1, 1]


def test_a_task_never_sees_the_platforms_secrets(worker, make_dag):
    """DATABASE_URL, REDIS_URL, SECRET_KEY and ORCHESTRATOR_* settings stay with the worker;
    ORCHESTRATOR_TASK_ENV_PASSTHROUGH lets a named one through; the task's context is there."""
    dag = make_dag([{"task_id": "env", "python_callable": T + "environment"}])
    run = trigger(dag)
    worker(EMAIL_URL="smtp://user:secret@mail.example.com", ORCHESTRATOR_TASK_ENV_PASSTHROUGH="EMAIL_URL")
    env = _finish(run, ["env"])["env"].attempts.get().result
    for secret in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ORCHESTRATOR_HEARTBEAT_INTERVAL", "ORCHESTRATOR_TASK_ENV_PASSTHROUGH"):
        assert secret not in env
    assert env["EMAIL_URL"] == "smtp://user:secret@mail.example.com"
    assert env["ORCHESTRATOR_TASK_ID"] == "env"
    assert env["ORCHESTRATOR_DAG_ID"] == dag.dag_id
