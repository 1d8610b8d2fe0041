"""A fan-out into a failing downstream: the circuit holds work that was already queued.

Dispatch checks the circuit, but a fan-out queues all its ready tasks at once while the circuit
is still closed. The worker checks again when it claims each job, so once the circuit opens the
rest go back to waiting, charged nothing: the downstream is called about
min_attempts + concurrency times, not once per task.
"""
from __future__ import annotations

import pytest

from orchestrator.engine.run_creation import create_manual_run
from orchestrator.models import Circuit, TaskAttempt, TaskInstance
from tests.circuits.test_downstream_outage import Downstream
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

TASKS = 100


@pytest.fixture
def downstream():
    service = Downstream()
    yield service
    service.close()

MIN_ATTEMPTS = 5
CONCURRENCY = 4


def test_a_100_task_fan_out_into_a_503_spends_about_min_attempts_not_one_try_per_task(worker, make_dag, downstream):
    Circuit.objects.create(name="fan-out-api", window=60, min_attempts=MIN_ATTEMPTS, failure_rate=0.5, cooldown=600, ramp=5)
    dag = make_dag(
        [
            {"task_id": f"call{i:03d}", "python_callable": "tests.limits.tasks.call", "op_kwargs": {"url": downstream.url}, "args": {"circuit": "fan-out-api"}}
            for i in range(TASKS)
        ],
        retries=0,
    )
    run = create_manual_run(dag)  # all 100 are queued now, the circuit still closed
    assert TaskInstance.objects.filter(dag_run=run, state="queued").count() == TASKS
    worker(ORCHESTRATOR_WORKER_CONCURRENCY=str(CONCURRENCY))
    wait_until(lambda: Circuit.objects.get(name="fan-out-api").state == "open", timeout=60, message="the circuit to open")

    def settled() -> bool:
        return not TaskInstance.objects.filter(dag_run=run, state__in=("queued", "running")).exists()

    wait_until(settled, timeout=120, message="every queued job claimed: run, or held")
    charged = TaskAttempt.objects.filter(task_instance__dag_run=run, state="failed", kind="user").count()
    assert len(downstream.failed_requests) == charged
    # The attempts that opened it, those already running when it opened, and a few claims that
    # raced the open: nowhere near one per task.
    assert MIN_ATTEMPTS <= charged <= MIN_ATTEMPTS + CONCURRENCY + 3, charged
    held = TaskInstance.objects.filter(dag_run=run, state="scheduled")
    assert held.count() == TASKS - charged
    for ti in held:
        assert (ti.waiting_for or {}).get("kind") == "circuit", ti.waiting_for
        assert ti.try_number == 1
        assert ti.attempts.count() == 0
