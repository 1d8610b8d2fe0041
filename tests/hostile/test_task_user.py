"""Tasks run as a task user: what such a task tries against the platform, through real workers.

Each test starts a real worker (root) with ORCHESTRATOR_TASK_USER set to a user made for the
run, runs a hostile python or bash task, and checks what it could reach."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchestrator.worker.forkserver import confinement
from tests.conftest import ROOT, wait_until
from tests.hostile.conftest import platform_names
from tests.worker.conftest import instance, settle, trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

SECRETS = ("test-only-secret",)  # bin/test's SECRET_KEY


def _files_under(directory: Path) -> list[str]:
    return [str(Path(top, name)) for top, _dirs, names in os.walk(directory) for name in names]


def test_a_python_task_runs_as_the_task_user_in_a_private_directory_that_goes_with_it(guarded_worker, make_dag, task_user):
    dag = make_dag([{"task_id": "who", "python_callable": "tests.hostile.tasks.who_am_i"}])
    guarded_worker(ORCHESTRATOR_TASK_ENV_DENY="ORCHESTRATOR_TEST_DENIED", ORCHESTRATOR_TEST_DENIED="deny-me")
    ti = settle(trigger(dag), "who", ("success",), timeout=60)
    seen = ti.result
    assert (seen["uid"], seen["euid"], seen["gid"]) == (task_user.uid, task_user.uid, task_user.gid)
    assert seen["groups"] in ([], [task_user.gid])
    assert seen["home"] == seen["cwd"] == seen["tmpdir"]
    assert seen["home_mode"] == "0o700"
    assert seen["home_owner"] == task_user.uid
    # The attempt's directory is removed once the attempt is over.
    wait_until(lambda: not Path(seen["home"]).exists(), timeout=10, message="the attempt's directory to be removed")
    names = set(seen["environment"])
    assert not names & {"SECRET_KEY", "DATABASE_URL", "REDIS_URL", "ORCHESTRATOR_TEST_DENIED", "ORCHESTRATOR_TASK_USER"}
    assert not any(secret in seen["environment_values"] for secret in SECRETS)
    assert "deny-me" not in seen["environment_values"]
    # Nor in what the kernel shows as its environment, the block it was forked with.
    assert not platform_names(seen["proc_environment"]), seen["proc_environment"]
    assert not any("deny-me" in entry for entry in seen["proc_environment"])


def test_an_attempt_cannot_signal_trace_or_read_another_attempts_processes(guarded_worker, make_dag):
    """Both attempts run as the task user; each is confined to its own processes (Landlock):
    the other's command is found in /proc, and is out of its reach."""
    if not confinement.available():
        pytest.skip("this kernel has no Landlock with signal scoping (Linux 6.12)")
    victim_cmdline = f"sleep 31.{os.getpid()}"
    victim_dag = make_dag([{"task_id": "victim", "bash_command": f"exec {victim_cmdline}"}])
    attacker_dag = make_dag([{"task_id": "attacker", "python_callable": "tests.hostile.tasks.attack_another_attempt", "op_kwargs": {"cmdline": victim_cmdline}}])
    guarded_worker()
    victim_run = trigger(victim_dag)
    settle(victim_run, "victim", ("running",), timeout=60)
    found = settle(trigger(attacker_dag), "attacker", ("success",), timeout=60).result
    assert found["victim"], found
    assert found["may signal"] == "EPERM", found
    assert found["signal"] == "EPERM", found
    assert found["ptrace"] == "EPERM", found
    assert found["environ"] in ("EACCES", "EPERM"), found
    assert found["mem"] in ("EACCES", "EPERM"), found
    assert found["signal own child"] == "ok", found
    assert instance(victim_run, "victim").state == "running"  # untouched


def test_a_bash_task_runs_as_the_task_user_in_its_private_directory(guarded_worker, make_dag, task_user):
    dag = make_dag([{"task_id": "who", "bash_command": 'echo "$(id -u) $(id -g) [$(id -G)] $(pwd) $HOME"; stat -c %a .'}])
    guarded_worker()
    ti = settle(trigger(dag), "who", ("success",), timeout=60)
    stdout = ti.attempts.get().stdout.split()
    uid, gid, groups, cwd, home, mode = stdout[:6]
    assert (int(uid), int(gid), groups) == (task_user.uid, task_user.gid, f"[{task_user.gid}]")
    assert cwd == home
    assert mode == "700"


def test_a_task_user_cannot_reach_the_workers_files_processes_or_secrets(guarded_worker, make_dag, worker_files):
    """The worker's spool, set-aside and output directories, its and its fork server's
    environment and memory: out of reach; it cannot signal or trace either."""
    first = make_dag([{"task_id": "chatty", "bash_command": "echo some output; echo more >&2"}])
    guarded_worker()
    settle(trigger(first), "chatty", ("success",), timeout=60)
    spool, output = worker_files["spool"], worker_files["output"]
    directories = [str(spool), *(str(p) for p in spool.iterdir() if p.is_dir()), str(output), *(str(p) for p in output.iterdir())]
    files = _files_under(output) + _files_under(spool)
    assert _files_under(output), "the first task's output was kept"
    dag = make_dag([{"task_id": "attack", "python_callable": "tests.hostile.tasks.attack_the_platform", "op_kwargs": {"directories": directories, "files": files}}])
    ti = settle(trigger(dag), "attack", ("success",), timeout=60)
    found = ti.result
    allowed = {key: value for key, value in found.items() if value == "ok" and key not in ("server", "worker")}
    assert allowed == {}, allowed
    for name in ("worker", "server"):
        assert found[f"environ {name}"] in ("EACCES", "EPERM")
        assert found[f"mem {name}"] in ("EACCES", "EPERM")
        assert found[f"may signal {name}"] == "EPERM"
        assert found[f"signal {name}"] == "EPERM"
        assert found[f"ptrace {name}"] == "EPERM"
    for path in files:
        assert Path(path).exists(), f"{path} was deleted by the task"
    assert not any(Path(d, "ti-1-1.json").exists() for d in directories)


@pytest.mark.parametrize(
    ("setting", "why"),
    [("no-such-user-here", "no such user"), ("root", "is root")],
)
def test_a_worker_that_cannot_run_tasks_as_the_task_user_refuses_to_start(spawn, setting, why):
    proc = spawn("run_worker", "nothing", env={"ORCHESTRATOR_TASK_USER": setting})
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert why in out
    assert "ORCHESTRATOR_TASK_USER" in out


def test_a_worker_that_is_not_root_refuses_a_task_user(process_env, task_user):
    env = {**process_env, "ORCHESTRATOR_TASK_USER": task_user.name}
    command = [*task_user.prefix, "setpriv", "--reuid", str(task_user.uid), "--regid", str(task_user.gid), "--clear-groups"]
    proc = subprocess.run([*command, sys.executable, str(ROOT / "manage.py"), "run_worker", "nothing"], env=env, cwd="/", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "not root" in proc.stderr


def test_the_workers_api_shows_the_task_user(guarded_worker, task_user, client, admin_user):
    proc = guarded_worker()
    client.force_login(admin_user)

    def listed():
        workers = client.get("/api/v1/workers").json()["workers"]
        return next((w for w in workers if w["pid"] == proc.pid), None)

    worker = wait_until(listed, timeout=60, message="the worker to register")
    assert worker["task_user"] == task_user.name
    assert any(f"tasks run as user {task_user.name}" in line for line in proc.log_lines)  # type: ignore[attr-defined]
    page = client.get("/workers/").content.decode()
    assert task_user.name in page


def test_without_a_task_user_the_api_says_null(worker, client, admin_user):
    proc = worker()
    client.force_login(admin_user)

    def listed():
        workers = client.get("/api/v1/workers").json()["workers"]
        return next((w for w in workers if w["pid"] == proc.pid), None)

    assert wait_until(listed, timeout=60, message="the worker to register")["task_user"] is None


@contextmanager
def _worker_not_root(process_env, queue_name, task_user, worker_files, **settings: str) -> Iterator[subprocess.Popen]:
    """A worker running as an ordinary user (the task user's account, but no task user set): so
    do its tasks. Its log is printed at the end."""
    if not process_env["DATABASE_URL"].startswith("postgres"):
        pytest.skip("the worker's user must reach the test database: over TCP on PostgreSQL only")
    base = worker_files["spool"].parent
    for path in worker_files.values():
        path.mkdir()
        os.chown(path, task_user.uid, task_user.gid)
    env = {
        **process_env,
        "ORCHESTRATOR_HEARTBEAT_INTERVAL": "0.2",
        "ORCHESTRATOR_SPOOL_DIR": str(worker_files["spool"]),
        "ORCHESTRATOR_TASK_OUTPUT_DIR": str(worker_files["output"]),
        "HOME": str(base),
        **settings,
    }
    env.pop("ORCHESTRATOR_TASK_USER", None)
    command = [*task_user.prefix, "setpriv", "--reuid", str(task_user.uid), "--regid", str(task_user.gid), "--clear-groups"]
    proc = subprocess.Popen(
        [*command, sys.executable, str(ROOT / "manage.py"), "run_worker", queue_name],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        yield proc
    finally:
        os.killpg(proc.pid, 9)
        out = proc.communicate(timeout=10)[0]
        print(out)


def test_without_a_task_user_a_worker_that_is_not_root_keeps_its_environment_and_memory_from_its_tasks(
    process_env, queue_name, make_dag, task_user, worker_files, scheduler_settings
):
    """No task user, the worker runs as an ordinary user (so do its tasks): the worker and its
    fork server are non-dumpable, so a task of the same user reads neither's environment or
    memory, nor traces them (signals, the docs say, it can send)."""
    with _worker_not_root(process_env, queue_name, task_user, worker_files):
        dag = make_dag([{"task_id": "attack", "python_callable": "tests.hostile.tasks.attack_the_platform", "op_kwargs": {"directories": [], "files": []}}])
        ti = settle(trigger(dag), "attack", ("success",), timeout=60)
        found = ti.result
        for name in ("worker", "server"):
            assert found[f"environ {name}"] in ("EACCES", "EPERM"), found
            assert found[f"mem {name}"] in ("EACCES", "EPERM"), found
            assert found[f"ptrace {name}"] == "EPERM", found
            assert found[f"may signal {name}"] == "ok", found  # same user: said so in the docs


def test_a_worker_that_is_not_root_watches_a_python_tasks_proportional_set_size(
    process_env, queue_name, make_dag, task_user, worker_files, scheduler_settings
):
    """Watched limits measure PSS: a forked Python task's share of the fork server's pages is
    small, its resident size is not. The worker, not root, may read the task's smaps_rollup."""
    with _worker_not_root(process_env, queue_name, task_user, worker_files, ORCHESTRATOR_MEMORY_LIMITS="watched"):
        dag = make_dag([{"task_id": "measured", "python_callable": "tests.hostile.tasks.own_memory", "op_kwargs": {"seconds": 1.0}}], memory_limit=512)
        ti = settle(trigger(dag), "measured", ("success",), timeout=60)
    own = ti.result
    peak = ti.attempts.get().peak_memory_mib
    assert peak is not None
    assert own["pss_mib"] < own["rss_mib"] - 4, own  # what separates the two here
    assert peak <= own["pss_mib"] + 4, (peak, own)
