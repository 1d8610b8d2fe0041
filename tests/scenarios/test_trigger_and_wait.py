"""trigger_dag --wait against a real scheduler and worker: exit codes 0, 1 and 3."""
from __future__ import annotations

import pytest

from orchestrator.models import DagRun, TaskInstance

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

FAST = {"ORCHESTRATOR_SCHEDULER_INTERVAL": "0.1", "ORCHESTRATOR_HEARTBEAT_INTERVAL": "0.2"}


def _wait(spawn, dag_id: str) -> tuple[int, list[str]]:
    proc = spawn("trigger_dag", dag_id, "--wait", "--timeout", "60", env=FAST)
    out, _ = proc.communicate(timeout=90)
    lines = [line for line in out.splitlines() if line.strip()]
    return proc.returncode, lines


@pytest.fixture
def system(spawn, queue_name):
    spawn("run_scheduler", env=FAST)
    spawn("run_worker", queue_name, env=FAST)


def test_it_exits_0_when_the_diamond_succeeds_in_order(system, spawn, make_dag):
    """a -> (b, c) -> d: success, and d starts only after b and c ended."""
    dag = make_dag(
        [
            {"task_id": "a", "bash_command": "echo a"},
            {"task_id": "b", "bash_command": "echo b", "upstream": ["a"]},
            {"task_id": "c", "bash_command": "echo c", "upstream": ["a"]},
            {"task_id": "d", "bash_command": "echo {{ task_id }} of {{ dag_id }}", "upstream": ["b", "c"]},
        ]
    )
    code, lines = _wait(spawn, dag.dag_id)
    assert code == 0, lines
    assert lines[-1] == "success", lines
    run = DagRun.objects.get(run_id=lines[0])
    attempts = {ti.task_id: ti.attempts.get() for ti in TaskInstance.objects.filter(dag_run=run)}
    assert attempts["a"].end_date <= attempts["b"].start_date
    assert attempts["a"].end_date <= attempts["c"].start_date
    assert max(attempts["b"].end_date, attempts["c"].end_date) <= attempts["d"].start_date
    assert attempts["d"].stdout.strip() == f"d of {dag.dag_id}"


def test_it_exits_1_when_the_run_fails(system, spawn, make_dag):
    """A bash task exiting non-zero fails the run: nonzero_exit, exit code 1."""
    dag = make_dag([{"task_id": "broken", "bash_command": "echo oops >&2; exit 4"}])
    code, lines = _wait(spawn, dag.dag_id)
    assert code == 1, lines
    assert lines[-1] == "failed", lines
    ti = TaskInstance.objects.get(dag_run__run_id=lines[0])
    assert ti.last_failure_context["reason"] == "nonzero_exit"
    assert ti.last_failure_context["metadata"]["exit_code"] == 4


def test_it_exits_3_when_a_poisoned_task_is_dead_lettered(system, spawn, make_dag):
    """The same fingerprint twice dead-letters the task; its downstream waits; the run stays running."""
    dag = make_dag(
        [
            {"task_id": "poisoned", "python_callable": "tests.scenarios.tasks.always_broken"},
            {"task_id": "after", "bash_command": "true", "upstream": ["poisoned"]},
        ],
        retries=5,
        poison_threshold=2,
    )
    code, lines = _wait(spawn, dag.dag_id)
    assert code == 3, lines
    assert lines[-1] == "dead_letter", lines
    run = DagRun.objects.get(run_id=lines[0])
    states = dict(TaskInstance.objects.filter(dag_run=run).values_list("task_id", "state"))
    assert states == {"poisoned": "dead_letter", "after": "none"}
    assert run.state == "running"
    poisoned = TaskInstance.objects.get(dag_run=run, task_id="poisoned")
    assert poisoned.try_number == 2
    assert poisoned.last_failure_context["reason"] == "poisoned"
    fingerprints = set(poisoned.attempts.values_list("fingerprint", flat=True))
    assert len(fingerprints) == 1
    assert None not in fingerprints
