"""Tasks that misbehave: print a lot, close their stdout, leave grandchildren that ignore SIGTERM
or escape the process group with setsid(), exhaust memory under a limit, leave zombies, return
values nothing can serialise, raise exceptions whose str() raises."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.faults.conftest import T, alive, kill_quietly, settle_runs, zombies_of
from tests.faults.invariants import assert_invariants
from tests.worker.conftest import instance, trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def test_misbehaving_tasks_each_end_in_a_truthful_state(worker, make_dag, tmp_path):
    """Eight misbehaving tasks side by side in one worker (concurrency 8), no retries: each ends in
    the state and context that tell what happened, none disturbs the others, and the worker
    leaves no process of theirs behind except the setsid() escapee (see failures-and-retries.md)."""
    marker = lambda name: str(tmp_path / name)  # noqa: E731
    timeout_args = {"execution_timeout": 2, "kill_grace": 1}
    dag = make_dag(
        [
            {"task_id": "chatty", "python_callable": T + "print_then_close_stdout", "op_kwargs": {"megabytes": 30}},
            {"task_id": "stubborn", "python_callable": T + "grandchild_ignoring_sigterm", "op_kwargs": {"marker": marker("stubborn")}, "args": timeout_args},
            {"task_id": "deaf", "python_callable": T + "sigterm_survivor_group", "op_kwargs": {"marker": marker("deaf")}, "args": timeout_args},
            {"task_id": "escapee", "python_callable": T + "setsid_escapee", "op_kwargs": {"marker": marker("escapee")}, "args": timeout_args},
            {"task_id": "greedy", "python_callable": T + "exhaust_memory", "op_kwargs": {"limit_mb": 100}},
            {"task_id": "zombies", "python_callable": T + "leave_zombies", "op_kwargs": {"count": 5, "marker": marker("zombies")}},
            {"task_id": "unpicklable", "python_callable": T + "unpicklable"},
            {"task_id": "bigresult", "python_callable": T + "big_result", "op_kwargs": {"megabytes": 2}},
        ],
        retries=0,
    )
    run = trigger(dag)
    proc = worker(ORCHESTRATOR_WORKER_CONCURRENCY="8")
    escapee = None
    try:
        settle_runs([run], timeout=60)
        tis = {ti.task_id: ti for ti in run.task_instances.all()}
        states = {task_id: ti.state for task_id, ti in tis.items()}
        reasons = {task_id: (ti.last_failure_context or {}).get("reason") for task_id, ti in tis.items()}
        # Printing 30 MB then closing both streams is a success; the output is clipped.
        chatty = tis["chatty"].attempts.get()
        assert states["chatty"] == "success"
        assert chatty.result == "closed"
        assert chatty.output_truncated
        # A grandchild that ignores SIGTERM, or a task that does: timeout, then SIGKILL to the group.
        for name in ("stubborn", "deaf"):
            assert (states[name], reasons[name]) == ("failed", "execution_timeout"), name
            context = tis[name].attempts.get().context
            assert context["category"] == "timeout", context
            assert context["metadata"]["sigkill_sent"] is True, context
            assert tis[name].attempts.get().kind == "user"
        stubborn_child = int(Path(marker("stubborn")).read_text())
        wait_until(lambda: not alive(stubborn_child), timeout=5, message="the SIGTERM-proof grandchild killed with its group")
        # The setsid() escapee: the task times out; the escapee left the group, so the group's
        # SIGKILL misses it. It survives, re-parented to the worker (the child subreaper).
        assert (states["escapee"], reasons["escapee"]) == ("failed", "execution_timeout")
        escapee = int(Path(marker("escapee")).read_text())
        assert alive(escapee), "the setsid() escapee was killed after all: update failures-and-retries.md"
        assert _ppid(escapee) == proc.pid
        # Memory exhausted under RLIMIT_AS: a MemoryError, the task's own fault.
        greedy = tis["greedy"]
        assert (states["greedy"], reasons["greedy"]) == ("failed", "task_exception")
        assert greedy.last_failure_context["metadata"]["exception_type"] == "MemoryError"
        assert greedy.attempts.get().kind == "user"
        # Zombies left by a successful task are reaped (by the worker, their subreaper).
        assert states["zombies"] == "success"
        zombie_pids = json.loads(Path(marker("zombies")).read_text())
        wait_until(lambda: not any(os.path.exists(f"/proc/{p}") and _ppid(p) in (proc.pid,) for p in zombie_pids), timeout=5, message="zombies reaped")
        assert not zombies_of(proc.pid)
        # A result JSON cannot carry, or one over ORCHESTRATOR_RESULT_MAX_BYTES, fails its attempt
        # as the task's own fault (invalid_result, charged to the user), and nothing is stored.
        for name in ("unpicklable", "bigresult"):
            assert (states[name], reasons[name]) == ("failed", "invalid_result"), name
            assert tis[name].last_failure_context["category"] == "application"
            assert tis[name].attempts.get().kind == "user"
            assert tis[name].result is None
        assert run.state == "failed"
        assert_invariants([run])
    finally:
        if escapee is None and Path(marker("escapee")).exists():
            escapee = int(Path(marker("escapee")).read_text())
        if escapee is not None:
            kill_quietly(escapee)


def test_a_setsid_escapee_outlives_its_worker(worker, make_dag, tmp_path):
    """A task that leaves a setsid() grandchild and returns: the task succeeds, the grandchild
    lives on, and even a kill -9 of the worker (the fork server kills every task *group*) does
    not reach it: it is re-parented to init. Nothing in the worker can catch it."""
    marker = str(tmp_path / "escapee")
    dag = make_dag([{"task_id": "leaver", "python_callable": T + "setsid_escapee_then_return", "op_kwargs": {"marker": marker}}])
    run = trigger(dag)
    proc = worker()
    escapee = None
    try:
        settle_runs([run])
        assert instance(run, "leaver").state == "success"
        escapee = int(Path(marker).read_text())
        assert alive(escapee)
        assert _ppid(escapee) == proc.pid
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        wait_until(lambda: _ppid(escapee) != proc.pid, timeout=5, message="the escapee re-parented")
        assert alive(escapee)
    finally:
        if escapee is not None:
            kill_quietly(escapee)


def test_an_exception_whose_str_raises_is_recorded_as_itself(worker, make_dag):
    dag = make_dag([{"task_id": "unprintable", "python_callable": T + "raise_unprintable"}], retries=0)
    run = trigger(dag)
    worker()
    settle_runs([run])
    ti = instance(run, "unprintable")
    assert (ti.state, ti.last_failure_context["category"], ti.last_failure_context["reason"]) == ("failed", "application", "task_exception")
    assert_invariants([run])
    assert ti.last_failure_context["metadata"]["exception_type"] == "StrRaises"
