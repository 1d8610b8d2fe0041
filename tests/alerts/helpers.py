"""Rules, DAGs and failures for the alerts tests, through the engine's own reports."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from alerts import rules_cache
from alerts.models import AlertRule
from orchestrator.engine import reporting
from orchestrator.engine.run_advance import advance_run
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.models import DagRun, TaskInstance
from retries.context import ExecutionContext
from retries.states import Reason, Source
from tests.engine.factories import DagFactory, TaskFactory

WORKER = reporting.WorkerInfo(hostname="h", worker_name="w", pid=1)


def rule(name: str = "r", **fields: Any) -> AlertRule:
    values: dict[str, Any] = {"when": "task_failed", "notify": "notifier:log", **fields}
    made = AlertRule.objects.create(name=name, **values)
    rules_cache.invalidate()
    return made


def run_of(dag_id: str, *, owner: str = "", tasks: tuple[str, ...] = ("t",), retries: int = 3) -> DagRun:
    dag = DagFactory(dag_id=dag_id, owner=owner, default_args={"retries": retries, "retry_delay": 0, "poison_threshold": 0})
    for task_id in tasks:
        TaskFactory(dag=dag, task_id=task_id)
    return create_manual_run(dag)


def ti_of(run: DagRun, task_id: str = "t") -> TaskInstance:
    return TaskInstance.objects.get(dag_run=run, task_id=task_id)


def fail(run: DagRun, task_id: str = "t", reason: Reason = Reason.TASK_EXCEPTION, error: str = "KeyError: 'x'") -> None:
    """One failed attempt of the task, reported as a worker would."""
    advance_run(run.pk)
    ti = ti_of(run, task_id)
    assert reporting.claim(ti.pk, ti.attempt_token, WORKER), ti.state
    assert reporting.mark_running(ti.pk, ti.attempt_token)
    context = ExecutionContext.of(reason, Source.WORKER)
    assert reporting.report_failure(ti.pk, ti.attempt_token, context, error=error, fingerprint="aaaaaaaaaaaa")


def succeed(run: DagRun, task_id: str = "t") -> None:
    advance_run(run.pk)
    ti = ti_of(run, task_id)
    assert reporting.claim(ti.pk, ti.attempt_token, WORKER), ti.state
    assert reporting.mark_running(ti.pk, ti.attempt_token)
    assert reporting.report_success(ti.pk, ti.attempt_token)


class Receiver:
    """A real HTTP server on 127.0.0.1 that records each POST's JSON and answers with
    `answers` in turn (an int: that status; "hang": no answer for `hang_for` seconds), then 200."""

    def __init__(self, answers: list[int | str] | None = None, hang_for: float = 30.0) -> None:
        import json

        self.bodies: list[dict[str, Any]] = []
        self.answers = list(answers or [])
        self.released = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.bodies.append(json.loads(body))
                answer = receiver.answers.pop(0) if receiver.answers else 200
                if answer == "hang":
                    receiver.released.wait(hang_for)
                    return
                self.send_response(int(answer))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/T0/B0/secret-token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def wait_for(predicate: Callable[[], object], timeout: float = 15.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s")
