"""Network partitions between a worker and its services, with packets dropped (not refused).

The worker runs in a network namespace of its own (`netns.Partition`); PostgreSQL (this test's
database) and a private Redis are reached through forwarders on the host side of a veth pair,
and nftables inside the worker's namespace drops the packets between them: to PostgreSQL, to
Redis, to both, in one direction only; while the worker is idle and while its tasks are
claimed, running and reporting. The scheduler's passes run in this test process, which is never
cut off. Every case ends with the fault suite's invariant check: nothing lost or stuck, never
two copies at once, every failure on the right budget, and the partitioned worker back at work
after the heal without a restart.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection

from orchestrator.engine.scheduler import schedule_once
from tests.conftest import ROOT, wait_until
from tests.faults.conftest import T, children_of, settle_runs
from tests.faults.invariants import assert_invariants, attempts_of, read_records
from tests.faults.netns import Partition
from tests.worker.conftest import trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

# The worker's and the scheduler's timing in these tests: a lease of 5.5 s.
HEARTBEAT = {"ORCHESTRATOR_HEARTBEAT_INTERVAL": "0.5", "ORCHESTRATOR_HEARTBEAT_TIMEOUT": "6"}


@pytest.fixture
def net(private_redis, settings) -> Partition:
    settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT = 6
    with Partition() as partition:
        db = connection.settings_dict
        partition.pg_port = partition.expose(int(db.get("PORT") or 5432), db.get("HOST") or "127.0.0.1")
        partition.redis_port = partition.expose(private_redis.port)
        yield partition


@pytest.fixture
def netns_worker(net: Partition, process_env, queue_name, tmp_path):
    """Start `run_worker` inside the namespace, reaching PostgreSQL and Redis only through it."""
    logs: list[tuple[int, list[str]]] = []
    db = connection.settings_dict
    database_url = f"postgres://{db.get('USER') or 'postgres'}@{net.host_ip}:{net.pg_port}/{db['NAME']}"
    redis_url = f"redis://{net.host_ip}:{net.redis_port}/0"

    def start(**env: str):
        # A spool of its own: a checkout's shared one would hand its reports to other workers.
        spool = {"ORCHESTRATOR_SPOOL_DIR": str(tmp_path / "spool")}
        merged = {**process_env, **HEARTBEAT, **spool, "DATABASE_URL": database_url, "REDIS_URL": redis_url, **env}
        proc = net.run([sys.executable, str(ROOT / "manage.py"), "run_worker", queue_name], env=merged, cwd=ROOT)
        lines: list[str] = []
        logs.append((proc.pid, lines))
        threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
        return proc

    yield start
    for pid, lines in logs:
        print(f"--- worker {pid} (in its namespace) ---\n{''.join(lines)}")


def _recorded(task_id: str, records, seconds: float) -> dict:
    return {"task_id": task_id, "python_callable": T + "recorded", "op_kwargs": {"records": str(records), "seconds": seconds}}


def _fork_server(worker_pid: int) -> int:
    def found() -> int | None:
        for pid in children_of(worker_pid):
            try:
                if b"forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
            except OSError:
                continue
        return None

    return wait_until(found, timeout=60, message="the worker's fork server")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _all_running(run, count: int) -> None:
    wait_until(lambda: run.task_instances.filter(state="running").count() == count, timeout=60, message=f"{count} tasks running")


def _passes_presume_nothing(seconds: float) -> None:
    """Scheduler passes for `seconds`: none may presume a task of the partitioned worker lost."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert not schedule_once().lost, "a task was presumed lost although its worker kept its lease"
        time.sleep(0.2)


def _succeeds(run) -> None:
    """The run ends in success (a last pass may be needed to end it)."""

    def ended() -> bool:
        schedule_once()
        run.refresh_from_db()
        return run.state in ("success", "failed")

    wait_until(ended, timeout=30, message="the run to end")
    assert run.state == "success"


def _platform_attempts(run) -> int:
    return sum(1 for ti in run.task_instances.all() for kind, *_ in attempts_of(ti) if kind == "platform")


def _ran_once_at_try_1(run) -> None:
    for ti in run.task_instances.all():
        assert attempts_of(ti) == [("user", "success", None, 1, 0)], (ti.task_id, attempts_of(ti))


def test_an_idle_worker_cut_off_for_20_seconds_takes_work_at_once_after_the_heal(net, netns_worker, make_dag, records):
    """Idle and cut off from both for 20 s, the worker's fork server sees its lease run out: it
    must neither spin while the lease is out, nor condemn the first task after the heal."""
    worker = netns_worker()
    server = _fork_server(worker.pid)
    time.sleep(2)  # its first heartbeats
    net.drop(net.pg_port)
    net.drop(net.redis_port)
    time.sleep(12)
    cpu_before = _cpu_seconds(server)
    time.sleep(8)
    spent = _cpu_seconds(server) - cpu_before
    assert spent < 0.5, f"the fork server spent {spent:.1f}s of CPU in 8s with its lease out and nothing to run"
    net.heal()
    healed = time.monotonic()
    dag = make_dag([_recorded(f"t{i}", records, 2) for i in range(3)])
    run = trigger(dag)
    settle_runs([run], timeout=60)
    print(f"figure: fork server CPU {spent:.2f}s in 8s of expired lease; 3 x 2s tasks done {time.monotonic() - healed:.1f}s after the heal")
    _succeeds(run)
    _ran_once_at_try_1(run)
    assert _fork_server(worker.pid) == server, "the fork server was restarted"
    assert_invariants([run], [records])


def test_a_database_that_hangs_while_tasks_run_is_an_outage_not_a_lost_worker(net, netns_worker, make_dag, records):
    """PostgreSQL's packets dropped for 20 s while three tasks run, Redis answering: the leases
    live in Redis, no task is killed or presumed lost, every task succeeds at try 1, once."""
    netns_worker(ORCHESTRATOR_WORKER_CONCURRENCY="3", ORCHESTRATOR_REPORT_PATIENCE="2")
    dag = make_dag([_recorded(f"t{i}", records, 25) for i in range(3)])
    run = trigger(dag)
    _all_running(run, 3)
    net.drop(net.pg_port)
    _passes_presume_nothing(20)
    net.heal()
    settle_runs([run], timeout=120)
    _succeeds(run)
    _ran_once_at_try_1(run)
    assert_invariants([run], [records])


def test_redis_dropped_while_tasks_run_changes_nothing(net, netns_worker, make_dag, records):
    """Redis's packets dropped for 15 s while tasks run: the database heartbeats go on (the
    heartbeat never waits on Redis's own records), no task is killed, all succeed once."""
    netns_worker(ORCHESTRATOR_WORKER_CONCURRENCY="3")
    dag = make_dag([_recorded(f"t{i}", records, 20) for i in range(3)])
    run = trigger(dag)
    _all_running(run, 3)
    net.drop(net.redis_port)
    _passes_presume_nothing(15)
    net.heal()
    settle_runs([run], timeout=120)
    _succeeds(run)
    _ran_once_at_try_1(run)
    assert_invariants([run], [records])


def test_a_worker_cut_off_from_both_while_running_stops_its_tasks_and_comes_back(net, netns_worker, make_dag, records):
    """Cut off from both for 10 s: its tasks are killed before any scheduler presumes them lost
    (never two copies at once), they are retried on the platform budget, and after the heal the
    same worker, never restarted, runs the retries."""
    worker = netns_worker(ORCHESTRATOR_WORKER_CONCURRENCY="2")
    dag = make_dag([_recorded(f"t{i}", records, 15) for i in range(2)], retries=0)
    run = trigger(dag)
    _all_running(run, 2)
    cut_at = time.monotonic()
    net.drop(net.pg_port)
    net.drop(net.redis_port)
    wait_until(lambda: schedule_once().lost or None, timeout=30, message="the tasks presumed lost")
    time.sleep(max(0.0, cut_at + 10 - time.monotonic()))
    net.heal()
    healed = time.monotonic()
    settle_runs([run], timeout=150)
    print(f"figure: cut from both: {_platform_attempts(run)} platform attempts; retries done {time.monotonic() - healed:.1f}s after the heal")
    _succeeds(run)
    assert worker.poll() is None, "the worker exited"
    for ti in run.task_instances.all():
        assert attempts_of(ti)[-1][:3] == ("user", "success", None), attempts_of(ti)
        assert ti.try_number == 1, attempts_of(ti)
        assert all(kind == "platform" for kind, *_ in attempts_of(ti)[:-1])
    assert_invariants([run], [records])


def test_database_answers_dropped_one_way_while_tasks_are_claimed_and_report(net, netns_worker, make_dag, records):
    """Only PostgreSQL's answers dropped (the worker's packets arrive) for 10 s while short tasks
    are claimed, run and report: no user try spent, nothing lost, never two at once."""
    netns_worker(ORCHESTRATOR_WORKER_CONCURRENCY="4", ORCHESTRATOR_REPORT_PATIENCE="2")
    dag = make_dag([_recorded(f"t{i}", records, 1) for i in range(16)])
    run = trigger(dag)
    wait_until(lambda: run.task_instances.filter(state="success").count() >= 2, timeout=60, message="tasks flowing")
    net.drop(net.pg_port, "in")
    time.sleep(10)
    net.heal()
    healed = time.monotonic()
    settle_runs([run], timeout=180)
    print(f"figure: one-way cut, 16 tasks: {_platform_attempts(run)} platform attempts; settled {time.monotonic() - healed:.1f}s after the heal")
    _succeeds(run)
    assert {ti.try_number for ti in run.task_instances.all()} == {1}
    assert_invariants([run], [records])
    assert read_records([records])


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not os.environ.get("ORCHESTRATOR_SLOW_TESTS"), reason="minutes long: ORCHESTRATOR_SLOW_TESTS=1")
def test_a_database_dropped_for_two_minutes_while_tasks_run_charges_nothing(net, netns_worker, make_dag, records):
    """PostgreSQL's packets dropped for 2 minutes, tasks finishing in the middle of it: outcomes
    spooled and delivered after the heal, nothing charged, nothing run twice."""
    netns_worker(ORCHESTRATOR_WORKER_CONCURRENCY="3", ORCHESTRATOR_REPORT_PATIENCE="2")
    dag = make_dag([_recorded(f"t{i}", records, 30 + 30 * i) for i in range(3)])
    run = trigger(dag)
    _all_running(run, 3)
    net.drop(net.pg_port)
    _passes_presume_nothing(120)
    net.heal()
    settle_runs([run], timeout=240)
    _succeeds(run)
    _ran_once_at_try_1(run)
    assert_invariants([run], [records])
