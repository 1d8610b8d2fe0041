"""Bash tasks started directly by the fork server (posix_spawn through setpriv): bash is the
task process, with no Python before it, and still every guarantee of a forked task process."""
from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from orchestrator.worker.forkserver.server import direct_spawner
from tests.conftest import wait_until
from tests.worker.conftest import gone, running_pid, settle, trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

needs_setpriv = pytest.mark.skipif(direct_spawner() is None, reason="no setpriv with --pdeathsig here")

INSPECT = r"""
echo "pid=$$"
echo "sid=$(cut -d' ' -f6 /proc/$$/stat)"
echo "parent=$(tr '\0' ' ' < /proc/$PPID/cmdline)"
echo "stdin=$(readlink /proc/$$/fd/0)"
for fd in /proc/$$/fd/*; do echo "fd $(basename $fd) $(readlink $fd)"; done
echo "dag=$ORCHESTRATOR_DAG_ID try=$ORCHESTRATOR_TRY_NUMBER secret=${DATABASE_URL:-none}"
echo "rendered={{ task_id }}"
"""


@needs_setpriv
def test_a_bash_task_is_bash_itself_with_only_its_output(worker, make_dag):
    """Its own session, the fork server its parent, stdin from /dev/null, only its stdout and
    stderr open, its context in its environment and none of the platform's secrets."""
    dag = make_dag([{"task_id": "inspect", "bash_command": INSPECT}])
    worker()
    run = trigger(dag)
    ti = settle(run, "inspect", ("success",))
    attempt = ti.attempts.get()
    lines = dict(line.split("=", 1) for line in attempt.stdout.splitlines() if "=" in line and not line.startswith("fd "))
    assert lines["sid"] == lines["pid"] == str(attempt.pid)
    assert "orchestrator.worker.forkserver" in lines["parent"]
    assert lines["stdin"] == "/dev/null"
    fds = [line.split()[1:] for line in attempt.stdout.splitlines() if line.startswith("fd ")]
    open_fds = {fd for fd, _ in fds if fd not in ("0", "1", "2")}
    # Only the descriptor `ls`/the loop itself opens may be there, never a socket or a pipe of ours.
    assert not any(target.startswith("socket:") for _, target in fds), fds
    assert len(open_fds) <= 1, fds
    assert lines["dag"].startswith(f"{dag.dag_id} try=1 secret=none")
    assert lines["rendered"] == "inspect"


@needs_setpriv
def test_a_bash_task_dies_with_its_fork_server_even_while_its_worker_is_stopped(worker, make_dag):
    """The parent-death signal a forked task process sets itself, a directly started one gets
    from setpriv: the fork server killed while the worker cannot act (SIGSTOP) takes it along."""
    dag = make_dag([{"task_id": "long", "bash_command": "sleep 60"}])
    proc = worker()
    run = trigger(dag)
    pid = running_pid(run, "long")
    server = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert "orchestrator.worker.forkserver" in Path(f"/proc/{server}/cmdline").read_text().replace("\0", " ")
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        os.kill(server, signal.SIGKILL)
        wait_until(lambda: gone(pid), timeout=5, message="the bash task to die with its fork server")
    finally:
        os.kill(proc.pid, signal.SIGCONT)


@needs_setpriv
def test_a_failpoint_in_the_task_process_still_fires_for_a_bash_task(worker, make_dag):
    """A bash task a task.* failpoint targets is started the forked way, so the failpoint has a
    process to fire in before the handshake: charged as a startup error, as for a python task."""
    dag = make_dag([{"task_id": "b", "bash_command": "echo ok"}], retries=1)
    worker(ORCHESTRATOR_FAILPOINTS="task.before_running@b=exit:3*1")
    run = trigger(dag)
    ti = settle(run, "b", ("success",))
    first = ti.attempts.get(attempt_token=1)
    assert first.start_date is None  # never recorded running: it died before its handshake
    assert (first.context["reason"], first.context["metadata"]["exit_code"]) == ("startup_error", 3)
    assert ti.try_number == 2
    assert ti.attempts.get(attempt_token=2).stdout == "ok\n"


def test_without_setpriv_there_is_no_direct_start(monkeypatch):
    """Where setpriv is missing, the fork server says so and bash tasks are forked as before."""
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert direct_spawner() is None


def _claimed(**overrides):
    from datetime import datetime, timezone

    from orchestrator.data.taskconfig import attempt_args, merge_args
    from orchestrator.engine.reporting import Claimed

    values = dict(
        pk=7, task_id="b", attempt_token=1, try_number=1, infrastructure_try_number=0, dag_id="d", run_id="r",
        logical_date=datetime(2026, 1, 1, tzinfo=timezone.utc), conf={}, args=attempt_args(merge_args({}, {})), has_definition=True,
        python_callable="", bash_command="echo {{ task_id }} {{ try_number }}", op_kwargs={},
    )
    return Claimed(**{**values, **overrides})


def test_a_bash_plan_names_its_command_and_context_unless_a_failpoint_needs_its_process(settings):
    """What the supervisor starts directly: the rendered command, and the context variables a
    forked task process would have set itself."""
    from orchestrator.worker.host.job import plan_for

    settings.ORCHESTRATOR_FAILPOINTS = ""
    plan = plan_for(_claimed())
    assert plan.command == ("bash", "-c", 'echo "${ORCHESTRATOR_SUBST_0}" "${ORCHESTRATOR_SUBST_1}"')
    assert plan.command_env["ORCHESTRATOR_DAG_ID"] == "d"
    assert plan.command_env["ORCHESTRATOR_TRY_NUMBER"] == "1"
    assert (plan.command_env["ORCHESTRATOR_SUBST_0"], plan.command_env["ORCHESTRATOR_SUBST_1"]) == ("b", "1")
    settings.ORCHESTRATOR_FAILPOINTS = "task.after_running@b=sleep:0"
    assert plan_for(_claimed()).command is None
    settings.ORCHESTRATOR_FAILPOINTS = "task.after_running@other=sleep:0"
    assert plan_for(_claimed()).command is not None
    assert plan_for(_claimed(bash_command="", python_callable="x.y")).command is None
