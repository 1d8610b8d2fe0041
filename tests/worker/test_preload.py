"""ORCHESTRATOR_PRELOAD_MODULES: loaded once in the fork server, so a task does not pay for them;
a module that starts a thread or opens a socket while imported makes the worker refuse to start."""
from __future__ import annotations

import pytest

from tests.conftest import wait_until
from tests.worker.conftest import settle, trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]


@pytest.mark.parametrize(
    ("module", "why"),
    [("tests.worker.preloads.starts_a_thread", "starts a thread"), ("tests.worker.preloads.opens_a_socket", "opens a socket")],
)
def test_a_worker_refuses_to_start_with_a_preload_that_starts_a_thread_or_opens_a_socket(worker, module, why):
    proc = worker(ORCHESTRATOR_PRELOAD_MODULES=f"tests.worker.preloads.plain,{module}")
    assert proc.wait(timeout=120) == 1
    said = lambda: "".join(proc.log_lines)  # type: ignore[attr-defined]  # noqa: E731
    wait_until(lambda: module in said() and why in said(), timeout=10, message=f"the worker to say that {module} {why}")


def test_a_preloaded_module_is_loaded_before_the_task_starts(worker, make_dag):
    modules = ["tests.worker.preloads.plain"]
    dag = make_dag([{"task_id": "look", "python_callable": "tests.worker.tasks.loaded_modules", "op_kwargs": {"names": modules}}])
    worker(ORCHESTRATOR_PRELOAD_MODULES="tests.worker.preloads.plain")
    ti = settle(trigger(dag), "look", ("success",), timeout=60)
    assert ti.result == {"tests.worker.preloads.plain": True}
