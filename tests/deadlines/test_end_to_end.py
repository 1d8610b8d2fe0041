"""The seed's test plan, scaled down, with real schedulers and workers.

Every case is a DAG of one or two ~1 s tasks run one after the other, with a deadline of
0.3 s (missed) or 120 s (met: ample even while 16 runs share the workers) from `dagrun_queued_at` or `task_started_at`, calling back either
a dotted-path callable (appends to a file) or `notifier:webhook` (a local HTTP server). A
missed deadline calls back exactly once; a met one never does.
"""
from __future__ import annotations

import itertools
import json
import threading
from collections import Counter
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection  # noqa: F401 - read by the skipif conditions
from django.utils import timezone
from rq import Queue, Worker

from deadlines.models import Deadline
from orchestrator.engine.run_creation import create_manual_run, create_run
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.models import DagRun
from tests.conftest import wait_until
from tests.deadlines.callables import read_calls
from tests.deadlines.factories import DeadlineDefinitionFactory, add_history, chain_dag

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

FAST = {"ORCHESTRATOR_DEADLINE_CHECK_INTERVAL": "0.2", "ORCHESTRATOR_SCHEDULER_INTERVAL": "0.2"}
SHORT, LONG = 0.3, 120.0


class Webhook:
    """A local endpoint counting POSTs per deadline id."""

    def __init__(self) -> None:
        self.calls: Counter[int] = Counter()
        calls = self.calls

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                calls[body["deadline_id"]] += 1
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook():
    hook = Webhook()
    yield hook
    hook.close()


@pytest.fixture(autouse=True)
def empty_queue():
    Queue("default", connection=get_redis()).empty()
    yield
    Queue("default", connection=get_redis()).empty()


def start_workers(spawn, count: int, env: dict[str, str]) -> None:
    for _ in range(count):
        spawn("run_worker", env=env)
    wait_until(lambda: len(Worker.all(connection=get_redis())) >= count, timeout=60, message=f"{count} workers up")


def start_scheduler(spawn, env: dict[str, str]) -> None:
    """Start a scheduler and return once it has run a deadline check (a due sentinel got missed)."""
    sentinel = chain_dag("scheduler_sentinel", paused=True)
    DeadlineDefinitionFactory(dag=sentinel, interval=0)
    run = create_run(sentinel, run_type="manual", logical_date=timezone.now() - timedelta(seconds=1))
    spawn("run_scheduler", env=env)
    wait_until(lambda: run.deadlines.filter(state="missed").exists(), timeout=60, message="scheduler checking deadlines")


def test_it_calls_back_once_when_missed_and_never_when_met(spawn, tmp_path, webhook):
    """16 cases: {dagrun_queued_at, task_started_at} x {callable, webhook} x {1, 2 tasks} x {0.3 s, 120 s}."""
    calls_file = tmp_path / "calls.jsonl"
    cases = []
    for i, (reference, kind, tasks, interval) in enumerate(
        itertools.product(["dagrun_queued_at", "task_started_at"], ["callable", "webhook"], [1, 2], [SHORT, LONG])
    ):
        dag = chain_dag(f"tc{i:02d}_{reference}_{kind}_{tasks}_{interval:g}", tuple(f"t{n}" for n in range(tasks)),
                        python_callable="tests.deadlines.callables.sleep_task")
        dag.tasks.update(op_kwargs={"seconds": 1.0})
        callback, kwargs = (
            ("tests.deadlines.callables.append_to_file", {"path": str(calls_file)})
            if kind == "callable"
            else ("notifier:webhook", {"url": webhook.url})
        )
        owners = [None] if reference == "dagrun_queued_at" else list(dag.tasks.all())
        for task in owners:
            DeadlineDefinitionFactory(dag=dag, task=task, reference=reference, interval=interval, callback=callback, callback_kwargs=kwargs)
        cases.append((dag, interval))

    env = {**FAST, "ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1"}
    start_workers(spawn, 8, env)
    spawn("run_scheduler", env=env)
    runs = [(create_manual_run(dag), interval) for dag, interval in cases]

    def settled() -> bool:
        if DagRun.objects.filter(pk__in=[r.pk for r, _ in runs]).exclude(state="success").exists():
            return False
        open_callbacks = Deadline.objects.filter(callback_state__in=["queued", "running"]).exists()
        return not open_callbacks and not Deadline.objects.filter(state__in=["pending", "at_risk"]).exists()

    wait_until(settled, timeout=90, interval=0.2, message="every run finished and every callback done")
    file_calls = Counter(call["context"]["deadline_id"] for call in read_calls(calls_file))
    for run, interval in runs:
        deadlines = list(run.deadlines.all())
        expected = 1 if run.dag.tasks.count() == 1 or deadlines[0].scope == "dag" else 2
        assert len(deadlines) == expected, run.dag.dag_id
        for d in deadlines:
            called = file_calls[d.pk] + webhook.calls[d.pk]
            if interval == SHORT:
                assert (d.state, d.callback_state, called) == ("missed", "success", 1), run.dag.dag_id
                assert d.lateness_seconds > 0
            else:
                assert (d.state, d.callback_state, called) == ("met", None, 0), run.dag.dag_id
                assert d.lateness_seconds < 0


def test_it_misses_a_queued_task_with_no_worker_and_calls_back_once_one_arrives(spawn, tmp_path):
    """No worker at all: the scheduler alone marks the task_queued_at deadline missed; the callback
    waits in the queue and runs once when a worker starts."""
    dag = chain_dag("nobody_home", ("extract",), python_callable="tests.deadlines.callables.sleep_task")
    out = tmp_path / "calls.jsonl"
    DeadlineDefinitionFactory(dag=dag, task=dag.tasks.get(), reference="task_queued_at", interval=SHORT,
                              callback="tests.deadlines.callables.append_to_file", callback_kwargs={"path": str(out)})
    spawn("run_scheduler", env=FAST)
    run = create_manual_run(dag)
    deadline = wait_until(lambda: Deadline.objects.filter(dag_run=run, state="missed").first(), timeout=30, message="missed")
    assert run.task_instances.get().state == "queued"
    assert deadline.callback_state == "queued"
    assert read_calls(out) == []
    start_workers(spawn, 1, FAST)
    wait_until(lambda: Deadline.objects.get(pk=deadline.pk).callback_state == "success", timeout=30, message="callback ran")
    assert len(read_calls(out)) == 1


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_it_misses_each_deadline_once_with_two_scheduler_processes(spawn):
    """Two `run_scheduler --once` processes drain 700 due deadlines at the same time: one job each."""
    dag = chain_dag("two_processes", paused=True)  # paused: the schedulers only check deadlines
    DeadlineDefinitionFactory(dag=dag, interval=1)
    queued = timezone.now() - timedelta(minutes=5)
    DagRun.objects.bulk_create(
        DagRun(dag=dag, run_id=f"r{i}", logical_date=queued, queued_at=queued, state="running") for i in range(700)
    )
    Deadline.objects.bulk_create(
        Deadline(dag_run=run, reference="dagrun_queued_at", callback="notifier:log", need_by=queued + timedelta(seconds=1))
        for run in DagRun.objects.filter(dag=dag)
    )
    first, second = spawn("run_scheduler", "--once"), spawn("run_scheduler", "--once")
    for proc in (first, second):
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
    assert Deadline.objects.filter(state="missed", callback_attempts=1, callback_state="queued").count() == 700
    ids = [j for j in Queue("default", connection=get_redis()).job_ids if j.startswith("deadline-")]
    assert len(ids) == len(set(ids)) == 700


def test_it_warns_once_before_the_miss_with_real_processes(spawn, tmp_path):
    """warn: true and a history of 1 s tasks: a 2.5 s deadline on three 1 s tasks warns (at_risk: true)
    once, then misses once."""
    dag = chain_dag("elmo_live", ("a", "b", "c"), python_callable="tests.deadlines.callables.sleep_task")
    dag.tasks.update(op_kwargs={"seconds": 1.0})
    out = tmp_path / "calls.jsonl"
    DeadlineDefinitionFactory(dag=dag, interval=2.5, warn=True, callback="tests.deadlines.callables.append_to_file",
                              callback_kwargs={"path": str(out)})
    add_history(dag, {"a": 1.0, "b": 1.0, "c": 1.0})
    start_workers(spawn, 1, FAST)
    start_scheduler(spawn, FAST)
    run = create_manual_run(dag)
    wait_until(lambda: DagRun.objects.get(pk=run.pk).state == "success", timeout=60, message="run finished")
    wait_until(lambda: len(read_calls(out)) >= 2, timeout=30, message="two callbacks")
    # The callback wrote its line just before its worker records the callback's success.
    wait_until(lambda: run.deadlines.get().callback_state != "running", timeout=10, message="callback recorded")
    deadline = run.deadlines.get()
    assert (deadline.state, deadline.callback_state, deadline.warn_callback_state) == ("missed", "success", "success")
    assert [c["context"]["at_risk"] for c in read_calls(out)] == [True, False]
    assert deadline.warned_at < deadline.need_by < deadline.resolved_at


def test_it_uses_the_logical_date_of_a_scheduled_run(spawn, tmp_path):
    """dagrun_logical_date: a scheduled run whose logical date is long past misses at once."""
    dag = chain_dag("backfilled", ("a",), python_callable="tests.deadlines.callables.sleep_task")
    DeadlineDefinitionFactory(dag=dag, reference="dagrun_logical_date", interval=60, callback="notifier:log")
    run = create_run(dag, run_type="scheduled", logical_date=timezone.now() - timedelta(hours=1))
    spawn("run_scheduler", env=FAST)
    wait_until(lambda: Deadline.objects.filter(dag_run=run, state="missed").exists(), timeout=30, message="missed")
