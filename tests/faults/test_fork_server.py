"""The worker's fork server at its edges: killed with its tasks, a start that fails after the
handshake, a reply that comes too late; what a task can read of the platform's secrets; and the
orphans a task leaves outside its group."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from django.db import connection

from orchestrator.worker.host.launcher import Launcher, LaunchError
from tests.conftest import wait_until
from tests.faults.conftest import T, children_of, settle_runs, zombies_of
from tests.faults.invariants import assert_invariants, attempts_of
from tests.worker.conftest import instance, running_pid, trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]


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


def _recorded(task_id: str, records, seconds: float) -> dict:
    return {"task_id": task_id, "python_callable": T + "recorded", "op_kwargs": {"records": str(records), "seconds": seconds}}


def test_a_fork_server_killed_with_kill_9_is_the_platforms_failure_and_the_worker_carries_on(worker, make_dag, records):
    """kill -9 of the fork server while a Python task and a bash task run: both die with it and
    are recorded as `worker_lost` (metadata: the fork server died), not `resource_exhaustion`,
    on the platform budget; the worker starts a new fork server and runs their retries."""
    dag = make_dag(
        [_recorded("py", records, 30), {"task_id": "sh", "bash_command": "sleep 30"}],
        retries=0,
    )
    proc = worker(ORCHESTRATOR_WORKER_CONCURRENCY="2")
    run = trigger(dag)
    running_pid(run, "py")
    running_pid(run, "sh")
    server = _fork_server(proc.pid)
    os.kill(server, signal.SIGKILL)
    # The retries are quick: the recorded task runs long only on its first platform try; the
    # bash one is cut short by failing over to a new command.
    wait_until(lambda: instance(run, "py").attempts.count() == 2, timeout=30, message="py retried")
    for task_id in ("py", "sh"):
        first = instance(run, task_id).attempts.order_by("attempt_token").first()
        wait_until(lambda first=first: first.refresh_from_db() or first.state == "failed", timeout=30, message=f"{task_id}'s first attempt failed")
        assert (first.kind, first.context["category"], first.context["reason"]) == ("platform", "infrastructure", "worker_lost"), first.context
        assert first.context["metadata"]["fork_server"] == "died"
    assert _fork_server(proc.pid) != server
    settle_runs([run], timeout=90)
    assert instance(run, "py").state == "success"
    assert instance(run, "py").try_number == 1
    assert proc.poll() is None
    assert_invariants([run], [records])


def test_a_bash_command_that_cannot_be_started_after_its_handshake_is_a_start_error(worker, make_dag):
    """A command too long for the fork server's socket (and for exec), whose "running" was
    already recorded: the attempt ends at once as `pre_execution_failure` (kind start_error) on
    the platform budget, not stranded `running` until a heartbeat timeout calls it
    `worker_lost`. (No scheduler pass runs here: only the worker's own report can end it.)"""
    dag = make_dag([{"task_id": "huge", "bash_command": "echo " + "x" * 300_000}], retries=0)
    worker(ORCHESTRATOR_HEARTBEAT_TIMEOUT="60")
    run = trigger(dag)
    ti = instance(run, "huge")
    wait_until(lambda: ti.attempts.filter(state="failed").exists(), timeout=30, message="the start's failure recorded")
    first = ti.attempts.order_by("attempt_token").first()
    assert (first.kind, first.context["reason"]) == ("platform", "pre_execution_failure"), first.context
    assert first.context["metadata"]["pre_execution_reason"] == "start_error"
    assert "too long" in first.context["metadata"]["error"].lower()


def test_a_spawned_reply_after_the_launcher_gave_up_kills_that_process(tmp_path):
    """The slot stopped waiting for the fork server's answer: the process it then starts must
    not run unwatched."""
    launcher = Launcher()
    launcher.start()
    try:
        if not launcher.direct:
            pytest.skip("no setpriv --pdeathsig here")
        launcher.reply_timeout = 0.0
        marker = "4242.4242"
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        (server,) = launcher.server_pids()
        os.kill(server, signal.SIGSTOP)  # its reply cannot come before the slot gives up
        try:
            with pytest.raises(LaunchError):
                launcher.spawn([out_w, err_w], {"PATH": os.environ["PATH"]}, ["sleep", marker])
        finally:
            os.kill(server, signal.SIGCONT)
        for fd in (out_w, err_w):
            os.close(fd)

        def sleepers() -> list[int]:
            found = []
            for entry in os.scandir("/proc"):
                if entry.name.isdigit():
                    try:
                        cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes()
                        state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
                    except OSError:
                        continue
                    if marker.encode() in cmdline and state not in ("Z", "X"):
                        found.append(int(entry.name))
            return found

        time.sleep(1.0)  # the reply has come by now
        wait_until(lambda: not sleepers(), timeout=10, message="the late process killed")
        for fd in (out_r, err_r):
            os.close(fd)
    finally:
        launcher.close()


def test_a_task_cannot_read_the_platforms_secrets(worker, make_dag):
    """SECRET_KEY, the database's password (in DATABASE_URL and PGPASSWORD) are nowhere a task
    can look: not in the fork server's environment (`cat /proc/$PPID/environ`), nor in a forked
    task's settings, objects, environment or the fork server's whole memory."""
    secret_key = "sk-" + os.urandom(12).hex()
    password = "pw-" + os.urandom(12).hex()
    pgpassword = "pg-" + os.urandom(12).hex()
    db = connection.settings_dict
    # The test database lets us in without a password: one in the URL is carried, never checked.
    database_url = f"postgres://{db.get('USER') or 'postgres'}:{password}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"
    needles = [s.encode().hex() for s in (secret_key, password, pgpassword)]
    dag = make_dag(
        [
            {"task_id": "sh", "bash_command": "tr '\\0' '\\n' < /proc/$PPID/environ; cat /proc/$PPID/cmdline"},
            {"task_id": "py", "python_callable": T + "secrets_seen", "op_kwargs": {"hex_needles": needles}},
        ]
    )
    proc = worker(SECRET_KEY=secret_key, DATABASE_URL=database_url, PGPASSWORD=pgpassword)
    run = trigger(dag)
    settle_runs([run], timeout=60)
    server = _fork_server(proc.pid)
    environ = Path(f"/proc/{server}/environ").read_bytes()
    for secret in (secret_key, password, pgpassword):
        assert secret.encode() not in environ
    sh = instance(run, "sh")
    assert sh.state == "success", sh.attempts.get().context
    seen = sh.attempts.get().stdout
    assert "PATH=" in seen  # it did read its parent's environment, which names no address either
    assert "DATABASE_URL=" not in seen
    for secret in (secret_key, password, pgpassword):
        assert secret not in seen
    py = instance(run, "py")
    assert py.state == "success", py.attempts.get().context
    assert py.attempts.get().result == {needle: [] for needle in needles}


def test_an_orphan_that_left_the_tasks_group_is_reaped(worker, make_dag, tmp_path):
    """A grandchild that calls setsid() (so leaves the task's group) and exits after its task
    ended comes back to the worker, a child subreaper: it is reaped, never left a zombie."""
    marker = tmp_path / "orphan"
    dag = make_dag([{"task_id": "t", "python_callable": T + "setsid_child_that_exits", "op_kwargs": {"marker": str(marker), "seconds": 2}}])
    proc = worker()
    run = trigger(dag)
    settle_runs([run], timeout=30)
    orphan = int(marker.read_text())
    time.sleep(3)  # it has exited by now, re-parented to the worker

    def reaped() -> bool:
        return not Path(f"/proc/{orphan}").exists() and not zombies_of(proc.pid)

    wait_until(reaped, timeout=10, message=f"the orphan {orphan} reaped (zombies of the worker: {zombies_of(proc.pid)})")
    assert attempts_of(instance(run, "t")) == [("user", "success", None, 1, 0)]


def test_a_handshake_retried_after_an_ambiguous_commit_does_not_kill_its_own_task(make_dag):
    """The "running" handshake commits but its answer is lost (the connection breaks after the
    commit): tried again, it is refused since the task is already running under its token. The
    supervisor must see its own handshake there and let the task run, not kill it as
    superseded. Real database, real fork server and task process; the lost answer is the one
    thing injected."""
    from django.db import OperationalError

    from orchestrator.engine import reporting
    from orchestrator.engine.reporting import WorkerInfo
    from orchestrator.engine.run_creation import create_manual_run
    from orchestrator.worker.final import Succeeded
    from orchestrator.worker.host.heartbeat import Heartbeats
    from orchestrator.worker.host.job import plan_for, supervisor_settings
    from orchestrator.worker.host.supervisor import Supervisor

    dag = make_dag([{"task_id": "t", "python_callable": "tests.worker.tasks.succeed"}])
    run = create_manual_run(dag)
    ti = instance(run, "t")
    worker_info = WorkerInfo(hostname="test", worker_name="test-ambiguous", pid=os.getpid())
    claimed = reporting.claim(ti.pk, ti.attempt_token, worker_info)
    assert claimed is not None
    lost_answers = []

    def db(function, *args, **kwargs):
        result = function(*args, **kwargs)
        if function is reporting.mark_running and not lost_answers:
            lost_answers.append(result)  # committed; the answer never arrives
            raise OperationalError("server closed the connection unexpectedly")
        return result

    launcher = Launcher()
    heartbeats = Heartbeats(interval=0.2, timeout=30)
    try:
        supervised = Supervisor(plan_for(claimed), worker_info, supervisor_settings(), launcher=launcher, heartbeats=heartbeats, db=db).run()
    finally:
        launcher.close()
    assert lost_answers == [True]
    assert not supervised.superseded, "the task was killed as superseded by its own handshake"
    assert isinstance(supervised.outcome.final, Succeeded), supervised.outcome


@pytest.mark.parametrize("failpoints", ["", "task.after_running@nothing_here=exit:3*1"])
def test_a_task_process_starts_with_redis_loaded_only_where_failpoints_count(worker, make_dag, failpoints):
    """Without failpoints no task process needs Redis, so the fork server does not load it (every
    fork would copy its pages); with a failpoint that counts its firings in Redis, it does."""
    dag = make_dag([{"task_id": "t", "python_callable": "tests.worker.tasks.loaded_modules", "op_kwargs": {"names": ["redis"]}}])
    run = trigger(dag)
    worker(ORCHESTRATOR_FAILPOINTS=failpoints)
    settle_runs([run], timeout=60)
    assert instance(run, "t").attempts.get().result == {"redis": bool(failpoints)}
