"""Failure injection (ORCHESTRATOR_FAILPOINTS) and the pre-execution failures it provokes."""
from __future__ import annotations

import logging
import random

import pytest

from orchestrator.worker.failpoints import Failpoint, FailpointError, fire, parse
from tests.worker.conftest import settle, trigger

T = "tests.worker.tasks."


def test_it_parses_every_action_with_an_optional_task_and_limit():
    """NAME[@TASK_ID]=kill|exit:N|sleep:S[*K], comma-separated, blanks ignored."""
    assert parse("task.before_running=exit:3*1, worker.before_spawn@extract=kill,,task.after_running=sleep:0.5") == [
        Failpoint("task.before_running", None, "exit", 3.0, 1),
        Failpoint("worker.before_spawn", "extract", "kill", None, None),
        Failpoint("task.after_running", None, "sleep", 0.5, None),
    ]
    assert parse("") == []


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ("task.before_running", "cannot parse 'task.before_running'"),
        ("task.before_running=explode", "cannot parse"),
        ("task.beforerunning=kill", "unknown failpoint 'task.beforerunning'"),
        ("task.before_running=exit:300", "exit code must be 0-255"),
    ],
)
def test_it_names_the_bad_entry_of_a_bad_spec(spec, complaint):
    """A typo in a game-day spec fails loudly instead of silently injecting nothing."""
    with pytest.raises(FailpointError, match="ORCHESTRATOR_FAILPOINTS") as raised:
        parse(spec)
    assert complaint in str(raised.value)


def test_it_fires_only_the_first_k_times_per_task_instance(settings, caplog):
    """`*K` is counted in Redis per failpoint and task instance (so it holds across processes)."""
    settings.ORCHESTRATOR_FAILPOINTS = "task.after_running=sleep:0*2"
    ti = random.randrange(10**9, 2 * 10**9)

    def fired(task_instance_id: int) -> bool:
        caplog.clear()
        fire("task.after_running", task_instance_id=task_instance_id, task_id="t")
        return "failpoint task.after_running fired" in caplog.text

    with caplog.at_level(logging.WARNING, logger="orchestrator.worker.failpoints"):
        assert [fired(ti) for _ in range(3)] == [True, True, False]
        assert fired(ti + 1)  # another task instance has its own count


def test_it_fires_a_task_scoped_failpoint_only_for_that_task(settings, caplog):
    """`NAME@TASK_ID`: other tasks pass through untouched."""
    settings.ORCHESTRATOR_FAILPOINTS = "task.after_running@other=sleep:0"
    with caplog.at_level(logging.WARNING, logger="orchestrator.worker.failpoints"):
        fire("task.after_running", task_instance_id=1, task_id="mine")
        assert "fired" not in caplog.text
        fire("task.after_running", task_instance_id=1, task_id="other")
        assert "fired for task other" in caplog.text


# --- pre-execution failures, end to end ------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_it_charges_a_startup_exit_to_the_user_by_default(worker, make_dag):
    """task.before_running=exit:3*1: pre-execution kind `error`, excluded by default, so it is
    charged to the user as application/startup_error; the user retry succeeds."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "succeed"}], retries=1)
    worker(ORCHESTRATOR_FAILPOINTS="task.before_running=exit:3*1")
    run = trigger(dag)
    ti = settle(run, "t", ("success",))
    assert (ti.try_number, ti.infrastructure_try_number) == (2, 0)
    first = ti.attempts.get(attempt_token=1)
    assert first.kind == "user"
    assert first.start_date is None
    assert first.context["category"] == "application"
    assert first.context["reason"] == "startup_error"
    assert first.context["metadata"]["pre_execution_reason"] == "error"
    assert first.context["metadata"]["exit_code"] == 3


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_it_retries_a_startup_exit_on_the_platform_when_no_kind_is_excluded(worker, make_dag, settings):
    """With ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS empty, the same exit is a platform retry."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "succeed"}], retries=0)
    worker(ORCHESTRATOR_FAILPOINTS="task.before_running=exit:3*1", ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS="")
    run = trigger(dag)
    ti = settle(run, "t", ("success",))
    assert (ti.try_number, ti.infrastructure_try_number) == (1, 1)
    first = ti.attempts.get(attempt_token=1)
    assert first.kind == "platform"
    assert first.context["category"] == "infrastructure"
    assert first.context["reason"] == "pre_execution_failure"
    assert first.context["metadata"]["pre_execution_reason"] == "error"


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_it_retries_a_task_process_killed_before_running_on_the_platform(worker, make_dag):
    """task.before_running=kill*1: pre-execution kind `killed`, a platform retry, then success."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "succeed"}], retries=0)
    worker(ORCHESTRATOR_FAILPOINTS="task.before_running=kill*1")
    run = trigger(dag)
    ti = settle(run, "t", ("success",))
    assert (ti.try_number, ti.infrastructure_try_number) == (1, 1)
    first = ti.attempts.get(attempt_token=1)
    assert first.kind == "platform"
    assert first.context["reason"] == "pre_execution_failure"
    assert first.context["metadata"]["pre_execution_reason"] == "killed"
    assert first.context["metadata"]["signal"] == "SIGKILL"


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_it_recovers_from_a_worker_that_dies_before_spawning(worker, make_dag):
    """worker.before_spawn=kill*1: the whole worker dies holding the job; the scheduler finds the
    queued task's stale heartbeat (pre_execution_failure/worker_died) and another worker runs it."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "succeed"}], retries=0)
    doomed = worker(ORCHESTRATOR_FAILPOINTS="worker.before_spawn=kill*1")
    run = trigger(dag)
    assert doomed.wait(timeout=15) == -9
    worker(ORCHESTRATOR_FAILPOINTS="worker.before_spawn=kill*1")
    ti = settle(run, "t", ("success",))
    assert (ti.try_number, ti.infrastructure_try_number) == (1, 1)
    first = ti.attempts.get(attempt_token=1)
    assert first.kind == "platform"
    assert first.context["source"] == "scheduler"
    assert first.context["reason"] == "pre_execution_failure"
    assert first.context["metadata"]["pre_execution_reason"] == "worker_died"


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_it_fails_a_task_whose_failpoint_fires_after_running_as_a_task_failure(worker, make_dag):
    """task.after_running=exit:5 fires after the handshake: the task ran, so it is the task's failure."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "succeed"}])
    worker(ORCHESTRATOR_FAILPOINTS="task.after_running@t=exit:5")
    run = trigger(dag)
    ti = settle(run, "t", ("failed",))
    attempt = ti.attempts.get()
    assert attempt.start_date is not None
    assert attempt.context["reason"] == "task_exception"
    assert attempt.context["metadata"]["exit_code"] == 5
