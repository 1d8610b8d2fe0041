"""The path of one task through a real worker: order, retries, outcomes, output, fencing."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from rq import Queue

from orchestrator.engine.dispatch import enqueue
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import TaskInstance
from retries.fingerprint import bash_fingerprint
from tests.conftest import wait_until
from tests.worker.conftest import instance, settle, trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

T = "tests.worker.tasks."


def test_it_runs_a_diamond_in_dependency_order(worker, make_dag):
    """a -> (b, c) -> d: each task starts only after its upstream tasks ended, and all succeed."""
    dag = make_dag(
        [
            {"task_id": "a", "python_callable": T + "succeed"},
            {"task_id": "b", "python_callable": T + "succeed", "upstream": ["a"]},
            {"task_id": "c", "python_callable": T + "succeed", "upstream": ["a"]},
            {"task_id": "d", "python_callable": T + "succeed", "upstream": ["b", "c"]},
        ]
    )
    worker()
    worker()
    run = trigger(dag, conf={"day": "monday"})
    settle(run, "d", ("success",))
    attempts = {tid: instance(run, tid).attempts.get() for tid in "abcd"}
    assert all(a.state == "success" for a in attempts.values())
    assert attempts["a"].end_date <= attempts["b"].start_date
    assert attempts["a"].end_date <= attempts["c"].start_date
    assert max(attempts["b"].end_date, attempts["c"].end_date) <= attempts["d"].start_date
    assert attempts["d"].result == {"task_id": "d", "try_number": 1, "conf": {"day": "monday"}}
    assert "hello from d try 1" in attempts["d"].stdout
    run.refresh_from_db()
    wait_until(lambda: run.refresh_from_db() or run.state == "success", timeout=5)


def test_it_retries_a_failing_task_with_backoff_until_it_succeeds(worker, make_dag):
    """Two ValueErrors then success: try_number 3, each retry waited its exponential backoff."""
    dag = make_dag(
        [{"task_id": "flaky", "python_callable": T + "fail_until", "op_kwargs": {"succeed_on_try": 3}}],
        retries=3,
        retry_delay=0.2,
        retry_jitter="none",
    )
    worker()
    run = trigger(dag)
    ti = settle(run, "flaky", ("success",))
    assert (ti.try_number, ti.infrastructure_try_number) == (3, 0)
    first, second, third = ti.attempts.order_by("attempt_token")
    for failed in (first, second):
        assert (failed.state, failed.kind) == ("failed", "user")
        assert failed.context["category"] == "application"
        assert failed.context["reason"] == "task_exception"
        assert failed.context["metadata"]["exception_type"] == "ValueError"
        assert failed.context["metadata"]["exit_code"] == 1
        assert len(failed.fingerprint) == 12
    assert first.fingerprint == second.fingerprint
    # exp = retry_delay * 2 ** (try - 1): 0.2 s after the first failure, 0.4 s after the second.
    for failed, retried, delay in ((first, second, 0.2), (second, third, 0.4)):
        waited = retried.queued_at - failed.end_date
        assert timedelta(seconds=delay) <= waited < timedelta(seconds=delay + 1.5)
    assert ti.last_failure_context["reason"] == "task_exception"


def test_it_fails_a_non_retryable_error_at_once(worker, make_dag):
    """NonRetryableError: application/non_retryable, failed with retries left."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "raise_non_retryable"}], retries=3)
    worker()
    run = trigger(dag)
    ti = settle(run, "t", ("failed",))
    assert ti.try_number == 1
    assert ti.last_failure_context["category"] == "application"
    assert ti.last_failure_context["reason"] == "non_retryable"


def test_it_retries_after_exactly_the_delay_a_task_asks_for(worker, make_dag):
    """RetryAfter(30): up_for_retry with next_retry_at 30 s after the failure, user budget charged."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "raise_retry_after", "op_kwargs": {"seconds": 30}}], retries=2)
    worker()
    run = trigger(dag)
    ti = settle(run, "t", ("up_for_retry",))
    attempt = ti.attempts.get()
    assert attempt.kind == "user"
    assert attempt.context["reason"] == "task_exception"
    assert attempt.context["metadata"]["retry_after"] == 30
    assert ti.next_retry_at - attempt.end_date == timedelta(seconds=30)


def test_it_retries_a_database_connection_failure_on_the_platform(worker, make_dag):
    """A task whose database connection is refused: infrastructure/db_connection_error, platform retry."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "database_unreachable_once"}])
    worker()
    run = trigger(dag)
    ti = settle(run, "t", ("success",))
    assert (ti.try_number, ti.infrastructure_try_number) == (1, 1)
    first = ti.attempts.get(attempt_token=1)
    assert first.kind == "platform"
    assert first.fingerprint is None
    assert first.context["category"] == "infrastructure"
    assert first.context["reason"] == "db_connection_error"
    assert first.context["metadata"]["exception_type"] == "OperationalError"


def test_it_fails_a_bash_task_that_exits_non_zero_with_its_fingerprint(worker, make_dag):
    """bash exit 3: application/nonzero_exit, fingerprint from the code and last stderr line."""
    command = 'echo "running {{ task_id }} try {{ try_number }} of {{ dag_id }}"; echo \'error 42 at step 7\' >&2; exit 3'
    dag = make_dag([{"task_id": "b", "bash_command": command}])
    worker()
    run = trigger(dag)
    ti = settle(run, "b", ("failed",))
    attempt = ti.attempts.get()
    assert attempt.context["reason"] == "nonzero_exit"
    assert attempt.context["metadata"]["exit_code"] == 3
    assert attempt.fingerprint == bash_fingerprint(3, "error 42 at step 7")
    assert attempt.fingerprint == bash_fingerprint(3, "error 1 at step 9")  # digits do not count
    assert f"running b try 1 of {run.dag.dag_id}" in attempt.stdout
    assert "error 42 at step 7" in attempt.stderr


def test_it_keeps_only_the_head_and_tail_of_unbounded_output(worker, make_dag):
    """20 MB on each stream: the attempt keeps the first and last bytes and says how much it dropped."""
    dag = make_dag([{"task_id": "loud", "python_callable": T + "print_a_lot", "op_kwargs": {"megabytes": 20}}])
    worker(ORCHESTRATOR_LOG_HEAD_BYTES=1000, ORCHESTRATOR_LOG_TAIL_BYTES=2000)
    run = trigger(dag)
    ti = settle(run, "loud", ("success",), timeout=40)
    attempt = ti.attempts.get()
    assert attempt.output_truncated
    for text in (attempt.stdout, attempt.stderr):
        assert text.startswith("BEGIN\n")
        assert text.endswith("END\n")
        assert "bytes dropped" in text
        assert len(text) < 1000 + 2000 + 200
    assert f"[{20 * 1024 * 1024 + 10 - 3000} bytes dropped]" in attempt.stdout


def test_it_drops_a_job_whose_attempt_is_no_longer_current(worker, make_dag, queue_name):
    """A job carrying an older attempt token changes nothing; the current one runs normally."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "succeed"}])
    run = trigger(dag)
    ti = instance(run, "t")
    assert ti.state == "queued"
    # A late duplicate of an earlier dispatch, ahead of the real job in the queue.
    stale_token = ti.attempt_token - 1
    Queue(queue_name, connection=get_redis()).empty()
    enqueue(queue_name, ti.pk, stale_token)
    enqueue(queue_name, ti.pk, ti.attempt_token)
    worker()
    ti = settle(run, "t", ("success",))
    assert list(ti.attempts.values_list("attempt_token", flat=True)) == [ti.attempt_token]
    stale_job = Queue(queue_name, connection=get_redis()).fetch_job(f"ti-{ti.pk}-{stale_token}")
    assert stale_job.return_value() == "stale"
    assert TaskInstance.objects.get(pk=ti.pk).try_number == 1


@pytest.mark.integration
def test_it_runs_a_class_method_named_by_its_dotted_path(worker, make_dag):
    """`pkg.mod.Class.method` passes the spec validation and runs in the task process as well."""
    dag = make_dag([{"task_id": "greet", "python_callable": "tests.worker.tasks.Greeter.greet", "op_kwargs": {"name": "ada"}}])
    run = trigger(dag)
    worker()
    ti = settle(run, "greet", ("success", "failed", "up_for_retry"))
    assert ti.state == "success"
    assert ti.attempts.get().result == "hello ada"


@pytest.mark.integration
@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite has no clock of its own: it reads the skewed process's")
def test_a_worker_with_a_skewed_clock_schedules_retries_on_the_databases_time(worker, make_dag):
    """A worker whose clock is an hour ahead reports a failure: next_retry_at and the attempt's
    times are the database's, so the retry is due in seconds, not in an hour."""
    from orchestrator.foundation.clock import db_now

    dag = make_dag([{"task_id": "flaky", "python_callable": "tests.worker.tasks.fail_until", "op_kwargs": {"succeed_on_try": 2}}], retries=1, retry_delay=0.5)
    run = trigger(dag)
    worker(ORCHESTRATOR_CLOCK_SKEW="3600")
    ti = settle(run, "flaky", ("up_for_retry", "success"))
    if ti.state == "up_for_retry":
        assert ti.next_retry_at - db_now() < timedelta(seconds=30)
    first = ti.attempts.order_by("attempt_token").first()
    assert abs((first.end_date - db_now()).total_seconds()) < 60
    assert settle(run, "flaky", ("success",)).try_number == 2
