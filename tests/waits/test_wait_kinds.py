"""`wait_for` tasks run no process: the scheduler's passes check them (no worker alive at all)."""
from __future__ import annotations

import http.server
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from orchestrator.engine import waitchecks, waits
from orchestrator.engine.run_creation import create_manual_run, create_run
from orchestrator.engine.scheduler import schedule_once
from orchestrator.models import Dag, DagRun, Task, TaskInstance, TaskWait
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _dag(wait_for: dict, *, downstream: bool = True, **default_args) -> Dag:
    dag = Dag.objects.create(dag_id=f"waits-{time.monotonic_ns()}", default_args={"queue": "nobody-listens", **default_args})
    Task.objects.create(dag=dag, task_id="wait", wait_for=wait_for, position=0)
    if downstream:
        Task.objects.create(dag=dag, task_id="after", wait_for={"time_after_logical_date": 0}, upstream=["wait"], position=1)
    return dag


def _ti(run: DagRun, task_id: str = "wait") -> TaskInstance:
    return TaskInstance.objects.get(dag_run=run, task_id=task_id)


def _settle(run: DagRun, states: tuple[str, ...], task_id: str = "wait", timeout: float = 20) -> TaskInstance:
    def reached() -> TaskInstance | None:
        schedule_once()
        ti = _ti(run, task_id)
        return ti if ti.state in states else None

    return wait_until(reached, timeout=timeout, interval=0.05, message=f"{task_id} to reach {states}")


def _pass_then(look):
    """One scheduler pass, then `look`."""
    schedule_once()
    return look()


@pytest.fixture(autouse=True)
def _no_checks_left() -> Iterator[None]:
    waitchecks.HttpChecks.forget_all()
    yield
    waitchecks.HttpChecks.forget_all()


def test_time_after_logical_date_waits_then_succeeds_and_its_downstream_runs():
    dag = _dag({"time_after_logical_date": 2}, poke_interval=1)
    run = create_manual_run(dag)
    schedule_once()
    ti = _ti(run)
    assert ti.state == "up_for_reschedule"
    assert ti.waiting_for["kind"] == "wait"
    assert ti.waiting_for["name"] == "time_after_logical_date"
    assert ti.waiting_for["next_check_at"] is not None
    assert ti.try_number == 1
    assert ti.attempts.count() == 1
    ti = _settle(run, ("success",), timeout=15)
    assert ti.result is None
    (attempt,) = ti.attempts.all()  # one attempt for the whole wait
    assert attempt.state == "success"
    assert attempt.kind == "user"
    assert attempt.context is None
    assert (attempt.end_date - attempt.start_date).total_seconds() >= 1.5
    _settle(run, ("success",), task_id="after")
    run.refresh_from_db()
    assert run.state == "success"


def test_time_in_the_dags_timezone():
    dag = _dag({"time": "2000-01-01T06:00:00"}, downstream=False)
    dag.timezone = "Europe/Amsterdam"
    dag.save()
    run = create_manual_run(dag)
    assert _settle(run, ("success",)).result is None


def test_dag_run_success_gives_the_run_id_and_failure_fails_the_wait_not_retried():
    upstream = Dag.objects.create(dag_id=f"upstream-{time.monotonic_ns()}", default_args={"queue": "nobody-listens"})
    Task.objects.create(dag=upstream, task_id="publish", python_callable="tests.worker.tasks.succeed")
    waiting = _dag({"dag_run": {"dag_id": upstream.dag_id, "task_id": "publish", "offset": 3600}}, downstream=False, retries=3, poke_interval=1)
    logical = create_manual_run(waiting).logical_date
    runs = DagRun.objects.filter(dag=waiting)
    (run,) = runs
    schedule_once()
    assert _ti(run).state == "up_for_reschedule"  # no run of the upstream DAG yet
    other = create_run(upstream, run_type=DagRun.RunType.MANUAL, logical_date=logical + timedelta(hours=1), now=logical)
    TaskInstance.objects.filter(dag_run=other, task_id="publish").update(state="success")
    ti = _settle(run, ("success",), timeout=10)
    assert ti.result == {"run_id": other.run_id}

    second = create_manual_run(waiting)
    failed = create_run(upstream, run_type=DagRun.RunType.MANUAL, logical_date=second.logical_date + timedelta(hours=1), now=logical)
    TaskInstance.objects.filter(dag_run=failed, task_id="publish").update(state="failed")
    ti = _settle(second, ("failed",), timeout=10)
    assert ti.last_failure_context["category"] == "application"
    assert ti.last_failure_context["reason"] == "wait_failed"
    assert ti.try_number == 1  # not retried
    assert ti.attempts.get().state == "failed"


class _Handler(http.server.BaseHTTPRequestHandler):
    answers: list[tuple[int, str]] = []

    def do_GET(self) -> None:
        status, body = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        self.send_response(status)
        if status in (301, 302):
            self.send_header("Location", "http://127.0.0.1:1/elsewhere")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server(settings) -> Iterator[str]:
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/ready"
    httpd.shutdown()


def test_http_answering_503_then_200_with_the_text(server):
    _Handler.answers = [(503, "busy"), (200, "not yet"), (200, "we are ready now")]
    dag = _dag({"http": {"url": server, "status": 200, "contains": "ready"}}, downstream=False, poke_interval=1)
    run = create_manual_run(dag)
    ti = _settle(run, ("success",), timeout=20)
    assert ti.result == {"status": 200, "text": "we are ready now"}
    assert TaskWait.objects.filter(task_instance=ti).count() == 0


def test_http_redirects_are_not_followed(server):
    _Handler.answers = [(302, "")]
    dag = _dag({"http": {"url": server, "status": 200}}, downstream=False, poke_interval=1)
    run = create_manual_run(dag)
    schedule_once()
    wait_until(lambda: _pass_then(lambda: TaskWait.objects.filter(task_instance__dag_run=run, last_check__isnull=False).exists()), timeout=10)
    wait = TaskWait.objects.get(task_instance__dag_run=run)
    assert wait.last_check == {"status": 302}
    assert _ti(run).state == "up_for_reschedule"


def test_http_to_a_host_not_allowed_is_never_met(settings):
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["partner.example"]
    dag = _dag({"http": {"url": "http://127.0.0.1:9/ready"}}, downstream=False, poke_interval=1)
    run = create_manual_run(dag)
    schedule_once()
    wait_until(lambda: _pass_then(lambda: TaskWait.objects.get(task_instance__dag_run=run).last_check), timeout=10)
    assert "not in ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS" in TaskWait.objects.get(task_instance__dag_run=run).last_check["error"]
    assert _ti(run).state == "up_for_reschedule"


def test_a_hanging_http_check_is_abandoned_at_its_limit_without_holding_up_the_pass(settings, monkeypatch):
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    monkeypatch.setattr(waitchecks, "HTTP_CHECK_TIMEOUT", 1.5)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)  # accepts connections and never answers
    try:
        dag = _dag({"http": {"url": f"http://127.0.0.1:{listener.getsockname()[1]}/"}}, downstream=False, poke_interval=1)
        run = create_manual_run(dag)
        started = time.monotonic()
        schedule_once()  # the wait begins and its first check is sent off
        schedule_once()
        assert time.monotonic() - started < 1.0  # no pass waited for the answer
        wait_until(lambda: _pass_then(lambda: TaskWait.objects.get(task_instance__dag_run=run).last_check), timeout=10)
        assert "no answer within 1.5s" in TaskWait.objects.get(task_instance__dag_run=run).last_check["error"]
        assert _ti(run).state == "up_for_reschedule"
    finally:
        listener.close()


def test_wait_timeout_fails_a_wait_not_retried():
    dag = _dag({"event": {"name": "never"}}, downstream=False, wait_timeout=1, retries=2)
    run = create_manual_run(dag)
    schedule_once()
    ti = _ti(run)
    assert ti.state == "up_for_reschedule"
    assert ti.waiting_for["next_check_at"] is None
    ti = _settle(run, ("failed",), timeout=10)
    assert (ti.last_failure_context["category"], ti.last_failure_context["reason"]) == ("timeout", "wait_timeout")
    assert ti.try_number == 1


def test_two_schedulers_complete_each_wait_once(spawn):
    dag = _dag({"time_after_logical_date": 0}, downstream=False, poke_interval=1)
    runs = [create_manual_run(dag) for _ in range(40)]
    procs = [spawn("run_scheduler", env={"ORCHESTRATOR_SCHEDULER_INTERVAL": "0.05"}) for _ in range(2)]
    wait_until(lambda: all(_ti(run).state == "success" for run in runs), timeout=60, interval=0.2, message="every wait to end")
    for proc in procs:
        proc.kill()
    for run in runs:
        ti = _ti(run)
        (attempt,) = ti.attempts.all()  # begun once, completed once
        assert attempt.state == "success"
        assert ti.try_number == 1


def test_time_waits_checked_together_are_due_again_spread_over_their_poke_interval():
    """600 time waits due at one instant (more than one pass checks: the rest are carried to the
    next pass) are each checked again at most one poke_interval later, and no later second has
    more than about its share of them (not all 500 of a pass in one burst a minute on)."""
    dag = Dag.objects.create(dag_id=f"waits-{time.monotonic_ns()}", default_args={"queue": "nobody-listens", "poke_interval": 60})
    Task.objects.bulk_create(Task(dag=dag, task_id=f"w{i}", wait_for={"time": "2099-01-01T00:00:00"}, position=i) for i in range(200))
    for _ in range(3):
        create_manual_run(dag)
    waiting = TaskWait.objects.filter(task_instance__dag_run__dag=dag)
    wait_until(lambda: _pass_then(waiting.count) == 600, timeout=60, interval=0, message="600 waits begun")
    due = timezone.now() + timedelta(seconds=5)  # past every first check the passes made
    waiting.update(next_check_at=due)

    assert waits.check_due(due).checked == waits.CHECKS_PER_PASS  # one pass checks its most...
    assert waits.check_due(due).checked == 600 - waits.CHECKS_PER_PASS  # ...the next the rest
    assert waits.check_due(due).checked == 0
    later = list(waiting.values_list("next_check_at", flat=True))
    assert all(due < at <= due + timedelta(seconds=60) for at in later)
    per_second = Counter(int((at - due).total_seconds()) for at in later)
    assert max(per_second.values()) <= 2 * 600 / 60, per_second.most_common(3)
    ti = TaskInstance.objects.filter(dag_run__dag=dag).first()
    assert ti is not None
    assert ti.state == "up_for_reschedule"
    assert ti.waiting_for["next_check_at"] is not None


def test_a_pass_moves_waits_not_met_on_in_statements_that_do_not_grow_with_their_number():
    """A time wait's check is nearly always "not yet": a claim, an update and a task's move each
    (three round trips and two commits per wait) made 10,000 time waits a quarter of a core. Now
    the pass settles them together: the same statements for 50 waits as for 250, and every task's
    `waiting_for` shows its wait's next check."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    counts = []
    for n in (50, 250):
        dag = Dag.objects.create(dag_id=f"waits-{time.monotonic_ns()}", default_args={"queue": "nobody-listens", "poke_interval": 60})
        Task.objects.bulk_create(Task(dag=dag, task_id=f"w{i}", wait_for={"time": "2099-01-01T00:00:00"}, position=i) for i in range(n))
        create_manual_run(dag)
        waiting = TaskWait.objects.filter(task_instance__dag_run__dag=dag)
        wait_until(lambda waiting=waiting, n=n: _pass_then(waiting.count) == n, timeout=60, interval=0, message=f"{n} waits begun")
        TaskWait.objects.exclude(task_instance__dag_run__dag=dag).update(next_check_at=None)  # only this DAG's are due
        due = timezone.now() + timedelta(seconds=5)
        waiting.update(next_check_at=due)
        before = dict(waiting.values_list("pk", "checks"))
        with CaptureQueriesContext(connection) as queries:
            assert waits.check_due(due).checked == n
        counts.append(len(queries.captured_queries))
        for wait in waiting.select_related("task_instance"):
            assert due < wait.next_check_at <= due + timedelta(seconds=60)
            assert wait.checks == before[wait.pk] + 1
            assert wait.task_instance.state == "up_for_reschedule"
            shown = wait.task_instance.waiting_for["next_check_at"]
            assert datetime.fromisoformat(shown.replace("Z", "+00:00")) == wait.next_check_at, (shown, wait.next_check_at)
    assert counts[0] == counts[1] <= 10, counts
