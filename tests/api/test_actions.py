"""orchestrator.operations.actions: what clear, mark success, mark failed and reclassify do to tasks and runs."""
from __future__ import annotations

import pytest

from orchestrator.data import metrics
from orchestrator.engine.transitions import transition
from orchestrator.exceptions import BadRequest, Conflict
from orchestrator.models import AuditLog, Dag, DagRun, TaskAttempt
from orchestrator.operations import actions
from retries.states import Reason, TaskState
from tests.api.factories import (
    chain_dag,
    fail,
    fail_until_failed,
    instance,
    make_run,
    start,
    succeed,
)

pytestmark = pytest.mark.django_db


def pause(dag: Dag) -> None:
    """A paused DAG's runs are not advanced, so an action's own result stays visible."""
    Dag.objects.filter(pk=dag.pk).update(paused=True)


def run_state(run: DagRun) -> str:
    run.refresh_from_db()
    return run.state


def failed_run(dag_id: str = "etl", **default_args) -> DagRun:
    """extract fails for good; transform and load are upstream_failed; the run failed."""
    dag = chain_dag(dag_id, **default_args)
    run = make_run(dag)
    fail_until_failed(run, "extract")
    assert run_state(run) == "failed"
    return run


def test_it_clears_a_failed_task_and_gives_it_retries_again(alice):
    """Clear: state none, max_tries = try_number + retries + 1, counters reset, user_action context, run reopened."""
    run = failed_run(retries=1)
    pause(run.dag)
    ti = instance(run, "extract")
    assert (ti.try_number, ti.max_tries) == (2, 2)

    entry = actions.clear(ti, alice, note="fixed the bucket")

    ti = instance(run, "extract")
    assert ti.state == TaskState.NONE
    assert ti.max_tries == 4  # tried twice, then a fresh retries + 1 = 2 tries
    assert ti.next_retry_at is None
    assert (ti.fingerprint_streak, ti.retry_is_platform, ti.pre_execution_tries) == (0, False, 0)
    context = ti.last_failure_context
    assert (context["category"], context["reason"], context["source"]) == ("user_action", "manual_clear", "api")
    assert context["metadata"] == {"user": "alice", "note": "fixed the bucket", "prior_state": "failed"}
    assert context["at"]
    assert run_state(run) == "running"
    assert run.end_date is None
    # Its downstream tasks are no longer upstream_failed: they wait for it again.
    assert instance(run, "transform").state == TaskState.NONE
    assert instance(run, "load").state == TaskState.NONE
    assert (entry.username, entry.action, entry.prior_state, entry.new_state) == ("alice", "clear", "failed", "none")
    assert (entry.dag_id, entry.run_id, entry.task_id, entry.user) == ("etl", run.run_id, "extract", alice)


def test_it_dispatches_a_cleared_task_at_once(alice):
    """After the clear, advance_run dispatches the task again as the next user try."""
    run = failed_run(retries=1)
    actions.clear(instance(run, "extract"), alice)
    ti = instance(run, "extract")
    assert ti.state == TaskState.QUEUED
    assert (ti.try_number, ti.max_tries) == (3, 4)
    assert ti.attempts.count() == 3


def test_it_never_lowers_max_tries_of_a_task_that_never_ran(alice):
    """A never-run task keeps retries + 1 tries when cleared with its upstream."""
    run = failed_run(retries=2)
    pause(run.dag)
    actions.clear(instance(run, "extract"), alice, include_downstream=True)
    load = instance(run, "load")
    assert (load.state, load.try_number, load.max_tries) == ("none", 0, 3)


def test_it_clears_downstream_tasks_only_when_asked(alice):
    """include_downstream clears every transitive downstream task; without it they stay as they are."""
    dag = chain_dag("ok_chain")
    run = make_run(dag)
    for task_id in ("extract", "transform", "load"):
        succeed(run, task_id)
    assert run_state(run) == "success"
    pause(dag)

    actions.clear(instance(run, "transform"), alice)
    assert [instance(run, t).state for t in ("extract", "transform", "load")] == ["success", "none", "success"]

    entry = actions.clear(instance(run, "extract"), alice, include_downstream=True)
    assert [instance(run, t).state for t in ("extract", "transform", "load")] == ["none", "none", "none"]
    assert [d["task_id"] for d in entry.details["downstream"]] == ["load"]  # transform was none already
    assert instance(run, "load").last_failure_context["metadata"]["cleared_with"] == "extract"
    assert run_state(run) == "running"


def test_it_refuses_to_clear_a_task_a_worker_holds(alice):
    """Clearing a queued or running task is a Conflict and changes nothing."""
    run = make_run(chain_dag())
    ti = start(run, "extract")
    with pytest.raises(Conflict, match="while it is running"):
        actions.clear(ti, alice)
    assert instance(run, "extract").state == TaskState.RUNNING
    assert not AuditLog.objects.exists()


def test_it_refuses_to_clear_downstream_that_a_worker_holds(alice):
    """With include_downstream, one running downstream task refuses the whole clear."""
    run = make_run(chain_dag())
    succeed(run, "extract")
    start(run, "transform")
    with pytest.raises(Conflict, match="transform"):
        actions.clear(instance(run, "extract"), alice, include_downstream=True)
    assert instance(run, "extract").state == TaskState.SUCCESS


def test_it_refuses_an_action_on_a_task_that_changed_since_it_was_read(alice):
    """The action's conditional update loses to a change made meanwhile; nothing is written."""
    run = failed_run()
    stale = instance(run, "extract")
    assert transition(stale.pk, expected=[TaskState.FAILED], state=TaskState.SCHEDULED)
    with pytest.raises(Conflict, match="changed meanwhile"):
        actions.mark_success(stale, alice)
    assert instance(run, "extract").state == TaskState.SCHEDULED
    assert not AuditLog.objects.exists()


def test_it_marks_a_failed_task_success_and_lets_its_downstream_run(alice):
    """Mark success: downstream upstream_failed tasks go back to waiting and run; the failed run reopens."""
    dag = chain_dag("mark_ok", retries=0)
    run = make_run(dag)
    succeed(run, "extract")
    fail(run, "transform")
    assert instance(run, "load").state == TaskState.UPSTREAM_FAILED
    assert run_state(run) == "failed"

    entry = actions.mark_success(instance(run, "transform"), alice, note="data checked by hand")

    transform = instance(run, "transform")
    assert transform.state == TaskState.SUCCESS
    assert transform.last_failure_context["reason"] == "manual_mark_success"
    assert transform.last_failure_context["metadata"]["prior_state"] == "failed"
    assert instance(run, "load").state == TaskState.QUEUED  # settled and dispatched
    assert run_state(run) == "running"
    assert entry.details["downstream"] == [{"task_id": "load", "prior_state": "upstream_failed", "new_state": "none"}]


def test_it_marks_a_dead_lettered_task_success(alice):
    """A poisoned, dead-lettered task marked success lets its downstream run."""
    dag = chain_dag("poisoned", retries=3, poison_threshold=2)
    run = make_run(dag)
    fail(run, "extract", fingerprint="aaaaaaaaaaaa")
    fail(run, "extract", fingerprint="aaaaaaaaaaaa")
    assert instance(run, "extract").state == TaskState.DEAD_LETTER

    actions.mark_success(instance(run, "extract"), alice)
    assert instance(run, "extract").state == TaskState.SUCCESS
    assert instance(run, "transform").state == TaskState.QUEUED


def test_it_marks_a_task_failed_and_fails_its_downstream(alice):
    """Mark failed: the task fails without retrying; downstream tasks become upstream_failed; the run fails."""
    run = make_run(chain_dag("mark_failed", retries=3))
    fail(run, "extract")
    assert instance(run, "extract").state == TaskState.UP_FOR_RETRY

    entry = actions.mark_failed(instance(run, "extract"), alice, note="source is gone")

    extract = instance(run, "extract")
    assert extract.state == TaskState.FAILED
    assert extract.next_retry_at is None
    assert extract.last_failure_context["reason"] == "manual_mark_failed"
    assert instance(run, "transform").state == TaskState.UPSTREAM_FAILED
    assert instance(run, "load").state == TaskState.UPSTREAM_FAILED
    assert run_state(run) == "failed"
    assert (entry.prior_state, entry.new_state, entry.details["note"]) == ("up_for_retry", "failed", "source is gone")


def test_it_reopens_a_succeeded_run_when_a_task_is_marked_failed(alice):
    """A success run whose task is marked failed ends failed."""
    run = make_run(chain_dag("was_ok"))
    for task_id in ("extract", "transform", "load"):
        succeed(run, task_id)
    actions.mark_failed(instance(run, "load"), alice)
    assert run_state(run) == "failed"


def test_it_reclassifies_a_user_failure_as_the_platforms(alice):
    """Reclassify: the attempt becomes platform/operator_reclassified, the retry comes back, the task runs again."""
    run = failed_run("reclassify_me", retries=0)
    before = {tuple(sorted(labels.items())): v for labels, v in metrics.read(metrics.INFRASTRUCTURE_RETRIES)}
    ti = instance(run, "extract")
    original = ti.attempts.get().context
    assert (ti.try_number, ti.max_tries, ti.infrastructure_try_number) == (1, 1, 0)

    entry = actions.reclassify(ti, alice, note="node was drained")

    attempt = TaskAttempt.objects.filter(task_instance=ti).order_by("attempt_token").first()
    assert attempt.kind == "platform"
    assert attempt.fingerprint is None
    assert (attempt.context["category"], attempt.context["reason"], attempt.context["source"]) == (
        "infrastructure", "operator_reclassified", "api",
    )
    assert attempt.context["metadata"]["original_context"] == original
    assert attempt.context["metadata"]["original_fingerprint"] == "4a7c1d9e02bb"
    assert (attempt.context["metadata"]["note"], attempt.context["metadata"]["user"]) == ("node was drained", "alice")

    ti = instance(run, "extract")
    assert ti.infrastructure_try_number == 1
    assert (ti.last_failure_context["category"], ti.last_failure_context["reason"]) == ("user_action", "manual_reclassify")
    # Scheduled and dispatched at once, repeating the same try the way a platform retry does:
    # it never reads as more tries than it was allowed.
    assert ti.state == TaskState.QUEUED
    assert (ti.try_number, ti.max_tries) == (1, 1)
    latest = ti.attempts.order_by("-attempt_token").first()
    assert (latest.try_number, latest.infrastructure_try_number) == (1, 1)
    assert instance(run, "transform").state == TaskState.NONE
    assert run_state(run) == "running"
    assert (entry.action, entry.prior_state, entry.new_state) == ("reclassify", "failed", "scheduled")
    assert entry.details["original_context"] == original

    key = (("dag_id", "reclassify_me"), ("reason", "operator_reclassified"), ("task_id", "extract"))
    after = {tuple(sorted(labels.items())): v for labels, v in metrics.read(metrics.INFRASTRUCTURE_RETRIES)}
    assert after[key] == before.get(key, 0) + 1


def test_it_reschedules_a_dead_lettered_task(alice):
    """A dead-lettered task goes to scheduled with one try given back, and its poison streak shrinks."""
    dag = chain_dag("dead_reclassify", retries=3, poison_threshold=2)
    run = make_run(dag)
    fail(run, "extract")
    fail(run, "extract")
    ti = instance(run, "extract")
    assert ti.state == TaskState.DEAD_LETTER
    assert ti.fingerprint_streak == 2
    pause(dag)

    actions.reclassify(ti, alice)

    ti = instance(run, "extract")
    assert (ti.state, ti.retry_is_platform, ti.next_retry_at) == ("scheduled", True, None)
    assert ti.fingerprint_streak == 1
    assert (ti.try_number, ti.max_tries, ti.infrastructure_try_number) == (2, 4, 1)
    # Only the latest user failure was reclassified.
    assert list(ti.attempts.order_by("attempt_token").values_list("kind", flat=True)) == ["user", "platform"]


def test_it_gives_the_retry_back_to_a_task_waiting_to_retry(alice):
    """A task that is up_for_retry keeps its state; its next dispatch repeats the try it lost."""
    run = make_run(chain_dag("waiting", retries=2, retry_delay=60))  # still waiting when reclassified
    fail(run, "extract")
    actions.reclassify(instance(run, "extract"), alice)
    ti = instance(run, "extract")
    assert (ti.state, ti.try_number, ti.max_tries, ti.infrastructure_try_number) == ("up_for_retry", 1, 3, 1)
    assert ti.retry_is_platform


def test_it_refuses_to_reclassify_without_a_user_failure(alice):
    """Only platform failures so far: there is nothing to reclassify (Conflict)."""
    run = make_run(chain_dag("platform_only"))
    fail(run, "extract", Reason.WORKER_LOST, fingerprint=None)
    ti = instance(run, "extract")
    assert ti.state == TaskState.SCHEDULED
    with pytest.raises(Conflict, match="no user-charged failed attempt"):
        actions.reclassify(ti, alice)


def test_it_triggers_a_run_and_audits_it(alice):
    """trigger: a manual run with its conf, triggered_by the user, and an audit row."""
    dag = chain_dag("triggered")
    run = actions.trigger(dag, alice, conf={"day": "2026-01-01"})
    assert (run.run_type, run.conf, run.triggered_by) == ("manual", {"day": "2026-01-01"}, "alice")
    entry = AuditLog.objects.get(action="trigger")
    assert (entry.dag_id, entry.run_id, entry.details) == ("triggered", run.run_id, {"conf": {"day": "2026-01-01"}})


def test_it_refuses_a_bad_conf_and_queues_a_paused_dags_run(alice):
    """A conf that is not an object is a BadRequest; a paused DAG's run waits queued."""
    dag = chain_dag("paused_dag")
    with pytest.raises(BadRequest, match="conf must be a JSON object"):
        actions.trigger(dag, alice, conf=[1, 2])
    assert not DagRun.objects.filter(dag=dag).exists()
    pause(dag)
    dag.refresh_from_db()
    run = actions.trigger(dag, alice, conf={})
    assert run.state == "queued"
    assert actions.waits_for_unpause(dag) == "DAG 'paused_dag' is paused: the run is queued and starts once the DAG is unpaused"


def test_a_cleared_task_with_no_retries_reads_true(alice):
    """retries: 0, failed on try 1, cleared: the next dispatch is try 2 of 2, never "2 of 1"."""
    run = failed_run("no_retries", retries=0)
    actions.clear(instance(run, "extract"), alice)
    ti = instance(run, "extract")
    assert (ti.state, ti.try_number, ti.max_tries) == ("queued", 2, 2)


def test_a_clear_fences_out_a_dispatch_that_read_the_task_before_it(alice):
    """The clear takes a new attempt token, so a dispatcher holding the old read loses."""
    run = failed_run("fenced", retries=0)
    pause(run.dag)
    before = instance(run, "extract")
    actions.clear(before, alice)
    assert instance(run, "extract").attempt_token == before.attempt_token + 1
    before.state = "scheduled"  # what a stale reader might have seen
    from django.utils import timezone

    from orchestrator.engine.dispatch import dispatch

    assert not dispatch(before, timezone.now())
    assert instance(run, "extract").state == "none"


def test_actions_take_their_time_from_the_shared_clock(alice):
    """A web host whose clock is an hour behind the database's still stamps an operator's
    action (the task's end, its context's `at`) on the database's time, as every other
    process does."""
    import time
    from datetime import timedelta

    from django.utils import timezone

    from orchestrator.foundation import clock

    run = make_run(chain_dag("clocked"))
    pause(run.dag)
    # As measured: the database is an hour ahead of this machine.
    clock._offset = (time.monotonic(), timedelta(hours=1))
    try:
        actions.mark_failed(instance(run, "extract"), alice, note="by the database's clock")
        actions.mark_success(instance(run, "transform"), alice)
    finally:
        clock._offset = None
    extract, transform = instance(run, "extract"), instance(run, "transform")
    ahead = timezone.now() + timedelta(minutes=59)
    assert extract.end_date > ahead
    assert transform.end_date > ahead
    assert extract.last_failure_context["at"] > ahead.isoformat()
