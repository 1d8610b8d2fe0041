"""A downstream goes down and comes back, with real workers: the circuit opens, holds every
task of the downstream without charging its budget, and on recovery releases the held tasks
spread over the ramp, not all in the same second."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestrator.engine.run_creation import create_manual_run
from orchestrator.models import Circuit, DagRun, TaskAttempt, TaskInstance
from retries.circuits import peak_per_second
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

TASKS = 60
RAMP = 6.0
COOLDOWN = 4.0


class Downstream:
    """A small HTTP service on 127.0.0.1 that answers 503 while it is down."""

    def __init__(self) -> None:
        self.down = True
        self.ok_requests: list[float] = []
        self.failed_requests: list[float] = []
        downstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                now = time.time()
                if downstream.down:
                    downstream.failed_requests.append(now)
                    self.send_response(503)
                else:
                    downstream.ok_requests.append(now)
                    self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok" if not downstream.down else b"down")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/pay"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def downstream() -> Iterator[Downstream]:
    service = Downstream()
    yield service
    service.close()


def _circuit() -> Circuit:
    return Circuit.objects.get(name="payments-api")


def test_an_outage_holds_tasks_and_recovery_releases_them_over_the_ramp(spawn, worker, make_dag, downstream):
    Circuit.objects.create(name="payments-api", window=30, min_attempts=5, failure_rate=0.5, cooldown=COOLDOWN, ramp=RAMP)
    dag = make_dag(
        [
            {"task_id": f"pay{i:03d}", "python_callable": "tests.limits.tasks.call", "op_kwargs": {"url": downstream.url}, "args": {"circuit": "payments-api"}}
            for i in range(TASKS)
        ],
        retries=3,
        retry_delay=0.2,
        retry_backoff="fixed",
        retry_jitter="none",
    )
    dag.max_active_tasks = 6  # the first wave: what reaches the downstream before the circuit knows
    dag.save()
    run = create_manual_run(dag)
    worker(ORCHESTRATOR_WORKER_CONCURRENCY=6)
    spawn("run_scheduler", env={"ORCHESTRATOR_SCHEDULER_INTERVAL": "0.1"})

    # The downstream is down: a handful of failures open the circuit.
    wait_until(lambda: _circuit().state == "open", timeout=30, message="the circuit to open")
    opened_at = _circuit().opened_at
    # Held, not failed: once what was dispatched before the open has ended (or been put back at
    # its claim), every unfinished task waits for the circuit with its budget untouched. Both
    # are read in one condition: a task dispatched just before the open is queued for a moment
    # after the first of them alone holds.
    wait_until(
        lambda: _all_held_by_circuit(run),
        timeout=20,
        message="attempts dispatched before the open to end and every waiting task to show the circuit",
    )
    before = dict(TaskInstance.objects.filter(dag_run=run).values_list("task_id", "try_number"))
    attempts_before = TaskAttempt.objects.filter(task_instance__dag_run=run).count()
    time.sleep(1.0)
    assert dict(TaskInstance.objects.filter(dag_run=run).values_list("task_id", "try_number")) == before
    assert TaskAttempt.objects.filter(task_instance__dag_run=run).count() == attempts_before
    assert not TaskInstance.objects.filter(dag_run=run, state="failed").exists()
    held = TaskInstance.objects.filter(dag_run=run, state__in=("scheduled", "up_for_retry")).count()
    assert held >= TASKS - 15
    # All of that happened within one cool-down: no probe went in between.
    assert (_circuit().state, _circuit().opened_at) == ("open", opened_at)

    # It recovers: after the cool-down one probe succeeds and the held tasks trickle out.
    downstream.down = False
    wait_until(lambda: DagRun.objects.get(pk=run.pk).state in ("success", "failed"), timeout=60, message="the run to end")
    assert DagRun.objects.get(pk=run.pk).state == "success"
    assert _circuit().state == "closed"
    released = sorted(downstream.ok_requests)
    assert len(released) == TASKS
    # Spread over the ramp, not a herd: the releases span most of it and no second gets many.
    span = released[-1] - released[0]
    assert span >= 0.6 * RAMP, span
    peak = max(peak_per_second([_at(t) for t in released]), 0)
    assert peak <= 2 * TASKS / RAMP + 3, peak


def _all_held_by_circuit(run: DagRun) -> bool:
    tis = list(TaskInstance.objects.filter(dag_run=run).values_list("state", "waiting_for"))
    if any(state in ("queued", "running") for state, _ in tis):
        return False
    return all((waiting_for or {}).get("kind") == "circuit" for state, waiting_for in tis if state in ("scheduled", "up_for_retry"))


def _at(timestamp: float):
    from datetime import datetime, timezone

    return datetime.fromtimestamp(timestamp, tz=timezone.utc)
