"""A task reads its run's params as context["params"]: the declared params of the filled conf."""
from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest

from orchestrator.data.taskconfig import attempt_args, merge_args
from orchestrator.engine.reporting import Claimed, claim
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.models import Dag, DagRun, Task
from orchestrator.worker.host.job import plan_for, worker_info
from tests.params.conftest import PARAMS, imported
from tests.worker.conftest import settle

pytestmark = pytest.mark.django_db


def _claimed(**overrides) -> Claimed:
    values = dict(
        pk=7, task_id="b", attempt_token=1, try_number=1, infrastructure_try_number=0, dag_id="d", run_id="r",
        logical_date=datetime(2026, 1, 1, tzinfo=timezone.utc), conf={"team": "ops", "x": 1}, args=attempt_args(merge_args({}, {})),
        has_definition=True, python_callable="", bash_command="", op_kwargs={}, params={"team": "ops"},
    )  # fmt: skip
    return Claimed(**{**values, **overrides})


@pytest.mark.parametrize("kind", [{"python_callable": "tests.params.tasks.echo_params"}, {"bash_command": "echo hi"}])
def test_the_context_of_either_kind_of_task_has_the_params(settings, kind):
    """Python and bash alike: the payload's context (what the task process and a bash command's
    templates read) holds the params beside the conf."""
    settings.ORCHESTRATOR_FAILPOINTS = ""
    context = plan_for(_claimed(**kind)).payload["context"]
    assert context["params"] == {"team": "ops"}
    assert context["conf"] == {"team": "ops", "x": 1}


def test_a_claim_reads_the_params_of_the_run(dag):
    run = create_manual_run(dag, conf={"mode": "full", "day_offset": 3, "other": True})
    ti = run.task_instances.get(task_id="a")
    type(ti).objects.filter(pk=ti.pk).update(state="queued", attempt_token=1)
    claimed = claim(ti.pk, 1, worker_info())
    assert claimed is not None
    assert claimed.params == {"mode": "full", "day_offset": 3, "team": "data"}
    assert claimed.conf == {"mode": "full", "day_offset": 3, "team": "data", "other": True}


def test_a_claim_of_a_dag_without_params_has_none(db):
    dag = imported({"dag_id": "plain", "tasks": [{"task_id": "a", "bash_command": "true"}]})
    run = create_manual_run(dag, conf={"x": 1})
    ti = run.task_instances.get()
    type(ti).objects.filter(pk=ti.pk).update(state="queued", attempt_token=1)
    claimed = claim(ti.pk, 1, worker_info())
    assert claimed is not None
    assert claimed.params == {}
    assert claimed.conf == {"x": 1}


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_python_task_run_by_a_real_worker_receives_its_params(worker, queue_name):
    dag = Dag.objects.create(
        dag_id=f"params-{uuid.uuid4().hex[:8]}", params=PARAMS, default_args={"queue": queue_name, "retry_delay": 0.1}
    )
    Task.objects.create(dag=dag, task_id="echo", python_callable="tests.params.tasks.echo_params")
    worker()
    run = create_manual_run(dag, conf={"mode": "incremental", "team": "ops", "note": "kept"})
    ti = settle(run, "echo", ("success", "failed"))
    assert ti.state == "success", ti.last_failure_context
    assert ti.result == {
        "params": {"mode": "incremental", "team": "ops", "day_offset": 1},
        "conf": {"mode": "incremental", "team": "ops", "day_offset": 1, "note": "kept"},
    }
    assert DagRun.objects.get(pk=run.pk).conf == ti.result["conf"]


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_bash_task_run_by_a_real_worker_reads_its_params(worker, queue_name):
    """`{{ params.NAME }}` reads the same context["params"]: given values and defaults alike."""
    dag = Dag.objects.create(
        dag_id=f"params-{uuid.uuid4().hex[:8]}", params=PARAMS, default_args={"queue": queue_name, "retry_delay": 0.1}
    )
    Task.objects.create(dag=dag, task_id="echo", bash_command='echo "{{ params.team }} {{ params.mode }} {{ params.day_offset }}"')
    worker()
    run = create_manual_run(dag, conf={"mode": "full"})
    ti = settle(run, "echo", ("success", "failed"))
    assert ti.state == "success", ti.last_failure_context
    assert ti.result == "data full 1"
