"""classify(): every way an attempt can end, named where the worker saw it (no processes, no DB)."""
from __future__ import annotations

import signal

import django.db.utils
import psycopg
import pytest

from orchestrator.exceptions import NonRetryableError, RetryAfter
from orchestrator.worker.classify import (
    Outcome,
    Stop,
    classify,
    db_connection_failure,
    exception_facts,
    oom_counters_matter,
)
from orchestrator.worker.final import BashExited, Failed, StartupFailed, Succeeded, Terminated
from retries.fingerprint import bash_fingerprint, fingerprint_of
from retries.states import Reason, TaskState

WORKER = {"worker_name": "host.1", "hostname": "host", "pid": 4242}


def outcome(**fields) -> Outcome:
    return Outcome(metadata=dict(WORKER), **{"handshake": True, **fields})


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def failure(exc: BaseException) -> Failed:
    return Failed(exception_facts(raised(exc)))


def test_it_reports_a_success_with_its_result():
    """A success message after the handshake is a success, whatever the exit code."""
    verdict = classify(outcome(returncode=0, final=Succeeded({"rows": 3})))
    assert verdict.success
    assert verdict.result == {"rows": 3}


def test_it_names_a_raised_exception_with_its_fingerprint():
    """application/task_exception: type, message, traceback, fingerprint and exit code in the metadata."""
    exc = raised(ValueError("row 17 is bad"))
    verdict = classify(outcome(returncode=1, final=Failed(exception_facts(exc))))
    context = verdict.context
    assert (context.category.value, context.reason.value, context.source.value) == ("application", "task_exception", "worker")
    assert verdict.fingerprint == fingerprint_of(exc)
    assert context.metadata["exception_type"] == "ValueError"
    assert context.metadata["message"] == "row 17 is bad"
    assert "Traceback" in context.metadata["traceback"]
    assert context.metadata["exit_code"] == 1
    assert context.metadata["worker_name"] == "host.1"
    assert context.metadata["pid"] == 4242
    assert verdict.expected == (TaskState.RUNNING,)


def test_it_names_a_non_retryable_error():
    verdict = classify(outcome(returncode=1, final=failure(NonRetryableError("no"))))
    assert verdict.context.reason is Reason.NON_RETRYABLE
    assert verdict.fingerprint is not None


def test_it_passes_on_the_delay_a_task_asks_for():
    """RetryAfter is still a task_exception (user budget), with retry_after for the decision,
    and without a fingerprint: asking to come back later never poisons a task."""
    verdict = classify(outcome(returncode=1, final=failure(RetryAfter(12.5))))
    assert verdict.context.reason is Reason.TASK_EXCEPTION
    assert verdict.retry_after == 12.5
    assert verdict.fingerprint is None
    assert "fingerprint" not in verdict.context.metadata


def test_it_recognises_a_database_connection_failure_as_infrastructure():
    """A Django OperationalError caused by a psycopg SQLSTATE 08 error: infrastructure/db_connection_error."""
    cause = psycopg.errors.lookup("08006")("connection failure")
    try:
        try:
            raise cause
        except psycopg.Error as exc:
            raise django.db.utils.OperationalError(str(exc)) from exc
    except django.db.utils.OperationalError as wrapped:
        facts = exception_facts(wrapped)
    verdict = classify(outcome(returncode=1, final=Failed(facts)))
    assert verdict.context.category.value == "infrastructure"
    assert verdict.context.reason is Reason.DB_CONNECTION_ERROR
    assert verdict.context.metadata["sqlstate"] == "08006"
    assert verdict.fingerprint is None


def test_it_recognises_a_refused_connection_without_sqlstate():
    """The client's own "connection refused" has no SQLSTATE; its message gives it away."""
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect("postgresql://nobody@127.0.0.1:1/none", connect_timeout=2)
    assert db_connection_failure(refused.value) == (True, None)
    assert db_connection_failure(psycopg.errors.lookup("42P01")("no such table")) == (False, None)
    assert db_connection_failure(ValueError("connection refused")) == (False, None)


def test_it_fingerprints_a_bash_exit_by_code_and_last_stderr_line():
    verdict = classify(outcome(is_bash=True, returncode=1, final=BashExited(2), stderr_tail="a\nfile 12 missing\n\n"))
    assert verdict.context.reason is Reason.NONZERO_EXIT
    assert verdict.context.metadata["exit_code"] == 2
    assert verdict.fingerprint == bash_fingerprint(2, "file 12 missing")


def test_it_counts_bash_killed_by_sigkill_as_resource_exhaustion():
    """bash itself SIGKILLed, or a child of it (137) while the cgroup's OOM counter grew."""
    killed = classify(outcome(is_bash=True, returncode=1, final=BashExited(-9)))
    assert killed.context.reason is Reason.RESOURCE_EXHAUSTION
    oom = classify(outcome(is_bash=True, returncode=1, final=BashExited(137), oom_kills_before=2, oom_kills_after=3))
    assert oom.context.reason is Reason.RESOURCE_EXHAUSTION
    assert oom.context.metadata["oom_kills_during_attempt"] == 1
    plain = classify(outcome(is_bash=True, returncode=1, final=BashExited(137), oom_kills_before=2, oom_kills_after=2))
    assert plain.context.reason is Reason.NONZERO_EXIT


def test_it_counts_a_sigkill_it_did_not_send_as_resource_exhaustion():
    verdict = classify(outcome(returncode=-9, oom_kills_before=0, oom_kills_after=1))
    context = verdict.context
    assert (context.category.value, context.reason) == ("infrastructure", Reason.RESOURCE_EXHAUSTION)
    assert context.metadata["signal"] == "SIGKILL"
    assert context.metadata["exit_code"] == -9
    assert context.metadata["oom_kill"] == 1


def test_it_blames_the_task_for_a_native_crash():
    verdict = classify(outcome(returncode=-signal.SIGSEGV))
    assert verdict.context.reason is Reason.TASK_EXCEPTION
    assert verdict.context.metadata["signal"] == "SIGSEGV"
    assert verdict.fingerprint


def test_it_treats_a_stop_from_outside_as_worker_termination():
    verdict = classify(outcome(returncode=143, final=Terminated()))
    assert verdict.context.reason is Reason.WORKER_TERMINATION
    assert verdict.context.metadata["external"] is True


def test_it_names_its_own_timeout():
    stop = Stop(Reason.EXECUTION_TIMEOUT, sigkill_sent=True, timeout=30, kill_grace=5)
    verdict = classify(outcome(returncode=-9, stop=stop, final=Terminated()))
    context = verdict.context
    assert (context.category.value, context.reason) == ("timeout", Reason.EXECUTION_TIMEOUT)
    assert context.metadata["timeout"] == 30
    assert context.metadata["sigkill_sent"] is True
    assert context.metadata["signal_sent"] == "SIGTERM"


def test_it_names_a_shutdown_stop_worker_termination_before_or_after_the_handshake():
    stop = Stop(Reason.WORKER_TERMINATION, shutdown_signal="SIGINT", kill_grace=5)
    running = classify(outcome(returncode=143, stop=stop))
    assert running.context.reason is Reason.WORKER_TERMINATION
    assert running.context.metadata["signal"] == "SIGINT"
    assert running.expected == (TaskState.RUNNING,)
    queued = classify(outcome(handshake=False, returncode=0, stop=stop))
    assert queued.context.reason is Reason.WORKER_TERMINATION
    assert queued.expected == (TaskState.QUEUED,)


def test_it_reports_the_real_outcome_of_a_task_that_finished_before_the_stop():
    stop = Stop(Reason.WORKER_TERMINATION, kill_grace=5)
    verdict = classify(outcome(returncode=0, stop=stop, final=Succeeded(1), final_before_stop=True))
    assert verdict.success


@pytest.mark.parametrize(
    ("returncode", "final", "kind"),
    [
        (3, None, "error"),
        (1, StartupFailed({"exception_type": "ImportError", "message": "no module x"}), "error"),
        (-9, None, "killed"),
        (-15, None, "killed"),
    ],
)
def test_it_names_the_kind_of_a_pre_execution_failure(returncode, final, kind):
    """Died before "running": infrastructure/pre_execution_failure, only while still queued."""
    verdict = classify(outcome(handshake=False, returncode=returncode, final=final))
    assert verdict.context.reason is Reason.PRE_EXECUTION_FAILURE
    assert verdict.context.metadata["pre_execution_reason"] == kind
    assert verdict.expected == (TaskState.QUEUED,)
    if final:
        assert verdict.context.metadata["exception_type"] == "ImportError"


def test_it_names_a_task_process_that_could_not_start():
    verdict = classify(Outcome(started=False, start_error="FileNotFoundError: python", metadata=dict(WORKER)))
    assert verdict.context.metadata["pre_execution_reason"] == "start_error"
    assert verdict.context.metadata["error"] == "FileNotFoundError: python"
    assert verdict.expected == (TaskState.QUEUED,)


@pytest.mark.parametrize(
    "seen",
    [
        # A Python task stopped before "go", its process killed by the stop.
        {"handshake": False, "returncode": -15, "stop": Stop(Reason.PRE_EXECUTION_FAILURE)},
        # A command started directly: nothing was started at all.
        {"handshake": False, "started": False, "is_bash": True},
    ],
)
def test_a_handshake_the_database_refused_is_a_start_error_from_queued_or_running(seen):
    """Not a lost connection: the task never ran, the platform's failure (start_error, on the
    platform budget while the pre-execution retries last), reported whichever of `queued` or
    `running` the task is in."""
    verdict = classify(outcome(**seen, handshake_refused="DataError: refused"))
    assert (verdict.context.category.value, verdict.context.reason) == ("infrastructure", Reason.PRE_EXECUTION_FAILURE)
    assert verdict.context.metadata["pre_execution_reason"] == "start_error"
    assert verdict.context.metadata["handshake_refused"] == "DataError: refused"
    assert verdict.context.metadata["during"] == "handshake"
    assert verdict.expected == (TaskState.QUEUED, TaskState.RUNNING)
    assert "refused" in verdict.error


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -1])
def test_retry_after_refuses_a_delay_that_is_not_a_finite_number_of_seconds(seconds):
    """NaN would reach the failure's metadata, which neither database stores as JSON."""
    from orchestrator.exceptions import RetryAfter

    with pytest.raises(ValueError, match="finite number >= 0"):
        RetryAfter(seconds)


def test_the_oom_counters_are_read_again_only_when_a_sigkill_may_explain_the_end():
    assert oom_counters_matter(-signal.SIGKILL)
    assert oom_counters_matter(128 + signal.SIGKILL)  # bash: a command of its SIGKILLed
    assert not any(oom_counters_matter(code) for code in (0, 1, -signal.SIGTERM, 128 + signal.SIGTERM, None))
