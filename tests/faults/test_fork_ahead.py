"""The next task process, forked ahead by the fork server (the spare), and a success reported
while its process is still exiting: what neither may change. A killed spare costs nothing but a
fresh fork; a spare holds nothing of the server's and dies with the worker; a success's output
is whole in its report; and what its process leaves behind is killed and reaped after it."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.faults.conftest import T, children_of, is_spare, settle_runs, zombies_of
from tests.faults.invariants import attempts_of
from tests.faults.test_fork_server import _fork_server
from tests.worker.conftest import instance, trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

QUICK = {"python_callable": "tests.worker.tasks.succeed"}


def _spare_of(server: int) -> int:
    """The fork server's one child that runs no task: the spare, waiting for its attempt (and
    named so for `ps`)."""

    def found() -> int | None:
        spares = [pid for pid in children_of(server) if is_spare(pid)]
        return spares[0] if len(spares) == 1 else None

    return wait_until(found, timeout=30, message=f"the spare of fork server {server}")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _a_worker_with_its_spare(worker, make_dag):
    """A worker that ran one task (so its fork server is up), its fork server and its spare."""
    dag = make_dag([{"task_id": "first", **QUICK}])
    proc = worker()
    settle_runs([trigger(dag)], timeout=60)
    server = _fork_server(proc.pid)
    return dag, proc, server, _spare_of(server)


def test_a_killed_spare_costs_the_next_task_nothing_but_a_fresh_fork(worker, make_dag):
    dag, proc, server, spare = _a_worker_with_its_spare(worker, make_dag)
    os.kill(spare, signal.SIGKILL)

    second = trigger(dag)
    settle_runs([second], timeout=30)
    ti = instance(second, "first")
    assert ti.state == "success"
    assert attempts_of(ti) == [("user", "success", None, 1, 0)]  # no platform retry
    wait_until(lambda: not zombies_of(server), timeout=10, message="the killed spare reaped")
    assert _spare_of(server) != spare  # a new one waits for the next task
    assert proc.poll() is None


def test_a_spare_holds_nothing_of_the_server_and_dies_with_the_worker(worker, make_dag):
    _, proc, server, spare = _a_worker_with_its_spare(worker, make_dag)
    # Standard input, output and error, and its own socket to the server: nothing else (not the
    # server's socket to the worker, nor its wake-up pipe).
    descriptors = {int(fd): os.readlink(f"/proc/{spare}/fd/{fd}") for fd in os.listdir(f"/proc/{spare}/fd")}
    beyond_stdio = {fd: target for fd, target in descriptors.items() if fd > 2}
    assert len(beyond_stdio) == 1, descriptors
    assert next(iter(beyond_stdio.values())).startswith("socket:"), descriptors
    # Its own session, like any task process: a signal to the worker's group does not reach it.
    assert os.getsid(spare) == spare

    proc.kill()
    proc.wait(timeout=10)
    wait_until(lambda: not _alive(spare) and not _alive(server), timeout=10, message="the spare gone with its worker")


def test_a_successs_output_is_whole_though_it_is_reported_before_its_process_ends(worker, make_dag):
    dag = make_dag([{"task_id": "t", "python_callable": T + "print_unterminated_then_succeed", "op_kwargs": {"text": "no newline"}}])
    worker()
    run = trigger(dag)
    settle_runs([run], timeout=60)
    attempt = instance(run, "t").attempts.get()
    assert attempt.state == "success"
    assert attempt.result == "done"
    assert attempt.stdout == "no newline"
    assert attempt.stderr == "no newline"


def test_what_a_success_leaves_in_its_group_is_killed_and_its_process_reaped(worker, make_dag, tmp_path):
    marker = tmp_path / "child"
    dag = make_dag([{"task_id": "t", "python_callable": T + "succeed_leaving_a_child", "op_kwargs": {"marker": str(marker)}}])
    proc = worker()
    run = trigger(dag)
    settle_runs([run], timeout=60)
    assert instance(run, "t").state == "success"
    child = int(marker.read_text())
    wait_until(lambda: not _alive(child), timeout=10, message=f"the task's child {child} killed")
    server = _fork_server(proc.pid)
    # The task's process is reaped (released by the worker): only the spare is left.
    wait_until(lambda: not zombies_of(server) and len(children_of(server)) == 1, timeout=10, message="the task process reaped")
    assert is_spare(children_of(server)[0])
    time.sleep(0.5)
    assert not zombies_of(proc.pid)


def test_an_idle_spare_is_let_go_and_the_next_task_is_forked_at_once():
    """A spare no attempt took within its idle time exits (an idle worker keeps no copy of its
    fork server); the next spawn forks its task process at once, and the one after it is forked
    ahead again, and let go in turn."""
    from orchestrator.worker.host.launcher import Launcher

    launcher = Launcher()
    launcher.start()
    try:
        (server,) = launcher.server_pids()
        first = _spare_of(server)  # forked as the server started
        launcher.let_spare_idle(0.3)
        wait_until(lambda: not _alive(first), timeout=10, message="the idle spare to exit")
        assert not [pid for pid in children_of(server) if is_spare(pid) and _alive(pid)]

        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        control_r, control_w = os.pipe()
        message_r, message_w = os.pipe()
        os.close(control_w)  # no attempt will come down its control pipe: it ends at once
        handle = launcher.spawn([out_w, err_w, control_r, message_w], {"PATH": os.environ["PATH"]})
        for fd in (out_w, err_w, control_r, message_w):
            os.close(fd)
        assert handle.pid != first
        handle.wait(timeout=10)
        handle.release()
        second = _spare_of(server)
        assert second not in (first, handle.pid)
        wait_until(lambda: not _alive(second), timeout=10, message="the next idle spare to exit")
        for fd in (out_r, err_r, message_r):
            os.close(fd)
    finally:
        launcher.close()
