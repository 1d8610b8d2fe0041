"""The scheduler's look for runs with work: a wide fan-in that must wait costs bounded reads,
and whatever may be settled is still found, whichever way its upstreams ended."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from orchestrator.engine.run_creation import create_run
from orchestrator.engine.run_reads import FEW_UPSTREAMS, UNFINISHED_PROBE
from orchestrator.engine.scheduler import runs_needing_work
from orchestrator.models import DagRun, Task, TaskInstance
from retries.states import RunState, TaskState
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = pytest.mark.django_db

WIDTH = FEW_UPSTREAMS + 36


def running_fan_in(dag_id: str, *, sink_rule: str = "all_success", others: int = 0) -> tuple[DagRun, list[str]]:
    """A running run of `WIDTH` tasks (all queued) -> sink, beside `others` queued tasks that
    are no upstream of the sink and sort before its upstreams."""
    dag = DagFactory(dag_id=dag_id)
    middle = [f"m{i:03d}" for i in range(WIDTH)]
    unrelated = [f"a{i:03d}" for i in range(others)]
    Task.objects.bulk_create(
        [Task(dag=dag, task_id=name, bash_command="true", upstream=[], position=i) for i, name in enumerate(unrelated + middle)]
    )
    TaskFactory(dag=dag, task_id="sink", upstream=middle, trigger_rule=sink_rule)
    run = create_run(dag, run_type=DagRun.RunType.MANUAL, logical_date=timezone.now())
    DagRun.objects.filter(pk=run.pk).update(state=RunState.RUNNING, start_date=timezone.now())
    TaskInstance.objects.filter(dag_run=run).exclude(task_id="sink").update(state=TaskState.QUEUED, attempt_token=1)
    return run, middle


def _set(run: DagRun, names: list[str], state: TaskState) -> None:
    TaskInstance.objects.filter(dag_run=run, task_id__in=names).update(state=state)


def test_a_waiting_fan_in_is_not_read_whole():
    """While the sink's upstreams run, the look leaves the run alone and reads none of its
    upstreams' states one by one: only bounded reads (its failed tasks, its first unfinished)."""
    run, middle = running_fan_in("wide_waits")
    _set(run, middle[:10], TaskState.SUCCESS)
    with CaptureQueriesContext(connection) as queries:
        assert run.pk not in runs_needing_work(timezone.now())
    assert not [q["sql"] for q in queries.captured_queries if "DISTINCT" in q["sql"]]


@pytest.mark.parametrize(
    ("rule", "ended", "needs_work"),
    [
        ("all_success", TaskState.FAILED, True),  # upstream_failed at once
        ("none_failed", TaskState.UPSTREAM_FAILED, True),
        ("one_failed", TaskState.FAILED, True),  # runs at once
        ("all_done", TaskState.FAILED, False),  # waits for the others
        ("one_success", TaskState.SUCCESS, True),  # runs at once
        ("one_success", TaskState.FAILED, False),
    ],
)
def test_one_upstream_ending_is_seen_as_its_rule_says(rule, ended, needs_work):
    run, middle = running_fan_in(f"wide_{rule}_{ended}", sink_rule=rule)
    _set(run, middle[-1:], ended)
    assert (run.pk in runs_needing_work(timezone.now())) is needs_work


def test_every_upstream_ended_is_seen():
    run, middle = running_fan_in("wide_all_ended")
    _set(run, middle, TaskState.SUCCESS)
    assert run.pk in runs_needing_work(timezone.now())


def test_upstreams_behind_other_unfinished_tasks_are_read():
    """The bounded read of unfinished tasks shows only tasks that are no upstream of the sink:
    the upstreams' states are then read, and their end is seen."""
    run, middle = running_fan_in("wide_behind", others=UNFINISHED_PROBE)
    _set(run, middle, TaskState.SUCCESS)
    assert run.pk in runs_needing_work(timezone.now())
    _set(run, middle[:1], TaskState.QUEUED)
    assert run.pk not in runs_needing_work(timezone.now())
