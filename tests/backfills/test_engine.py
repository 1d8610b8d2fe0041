"""Backfills against the database: dates, reprocess behaviours, the limit and order, pause, cancel.

The scheduler's step runs in the test process here; tests/backfills/test_live.py runs real
schedulers and workers."""
from __future__ import annotations

from datetime import timezone as dt_timezone
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.utils import timezone

from deadlines.models import Deadline, DeadlineDefinition
from orchestrator.engine import backfill_runs as engine
from orchestrator.engine.run_advance import advance_run
from orchestrator.engine.run_creation import create_run
from orchestrator.engine.scheduler import schedule_once
from orchestrator.models import AuditLog, Backfill, BackfillDate, DagRun, TaskInstance
from orchestrator.operations import backfills
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = pytest.mark.django_db

AMS = ZoneInfo("Europe/Amsterdam")
UTC = dt_timezone.utc


def daily_dag(**fields):
    dag = DagFactory(schedule="0 0 * * *", timezone="Europe/Amsterdam", **fields)
    TaskFactory(dag=dag, task_id="extract")
    TaskFactory(dag=dag, task_id="load", upstream=["extract"])
    return dag


def make(dag, start="2026-03-27", end="2026-03-31", **options):
    return backfills.create(backfills.check(dag, start=start, end=end, **options), None, created_by="tester")


def finish(run_pk, state="success"):
    """What the workers would do: every task of the run ends in `state`, then the run moves on."""
    TaskInstance.objects.filter(dag_run_id=run_pk).update(state=state)
    advance_run(run_pk)


def started_dates(backfill):
    return [
        d.logical_date
        for d in BackfillDate.objects.filter(backfill=backfill, state=BackfillDate.State.STARTED).order_by("dag_run_id")
    ]


def test_it_takes_the_dates_of_the_schedule_in_the_dags_timezone_across_dst():
    """Local midnight in Amsterdam: 23:00 UTC before the clocks go forward on 29 March, 22:00 after."""
    dag = daily_dag()
    request = backfills.check(dag, start="2026-03-27", end="2026-03-31")
    assert [d.astimezone(UTC).isoformat() for d in request.dates] == [
        "2026-03-26T23:00:00+00:00",
        "2026-03-27T23:00:00+00:00",
        "2026-03-28T23:00:00+00:00",
        "2026-03-29T22:00:00+00:00",
        "2026-03-30T22:00:00+00:00",
    ]
    assert all(d.astimezone(AMS).hour == 0 for d in request.dates)


def test_an_aware_bound_is_taken_as_written():
    dag = daily_dag()
    request = backfills.check(dag, start="2026-03-28T23:00:00+00:00", end="2026-03-29T22:00:00Z")
    assert [d.astimezone(AMS).day for d in request.dates] == [29, 30]


def test_dry_run_says_create_skip_or_rerun_and_changes_nothing():
    dag = daily_dag()
    days = backfills.check(dag, start="2026-03-27", end="2026-03-30").dates
    failed = create_run(dag, run_type="scheduled", logical_date=days[0])
    DagRun.objects.filter(pk=failed.pk).update(state="failed")
    succeeded = create_run(dag, run_type="scheduled", logical_date=days[1])
    DagRun.objects.filter(pk=succeeded.pk).update(state="success")
    create_run(dag, run_type="manual", logical_date=days[2])  # queued: never touched
    counts = (Backfill.objects.count(), DagRun.objects.count())
    expected = {
        "none": ["skip", "skip", "skip", "create"],
        "failed": ["rerun", "skip", "skip", "create"],
        "completed": ["rerun", "rerun", "skip", "create"],
    }
    for reprocess, actions in expected.items():
        request = backfills.check(dag, start="2026-03-27", end="2026-03-30", reprocess=reprocess)
        assert [str(p.action) for p in backfills.preview(request)] == actions
    assert (Backfill.objects.count(), DagRun.objects.count()) == counts


def test_reprocess_failed_clears_the_failed_the_upstream_failed_and_the_dead_lettered():
    dag = daily_dag()
    TaskFactory(dag=dag, task_id="report", upstream=["extract"])
    TaskFactory(dag=dag, task_id="audit")
    day = backfills.check(dag, start="2026-03-27", end="2026-03-27").dates[0]
    run = create_run(dag, run_type="scheduled", logical_date=day)
    for task_id, state in (("extract", "failed"), ("load", "upstream_failed"), ("report", "dead_letter"), ("audit", "success")):
        TaskInstance.objects.filter(dag_run=run, task_id=task_id).update(state=state, try_number=1)
    DagRun.objects.filter(pk=run.pk).update(state="failed", end_date=timezone.now())
    backfill = make(dag, "2026-03-27", "2026-03-27", reprocess="failed")
    assert engine.start_batch(backfill.pk, timezone.now()) == 1
    run.refresh_from_db()
    assert (run.state, run.backfill_id, run.run_type, run.end_date) == ("running", backfill.pk, "backfill", None)
    states = dict(TaskInstance.objects.filter(dag_run=run).values_list("task_id", "state"))
    assert states["audit"] == "success"  # a task that succeeded is kept
    assert states["extract"] == "queued"  # cleared, then dispatched at once
    assert states["load"] == "none"
    assert states["report"] == "none"
    extract = TaskInstance.objects.get(dag_run=run, task_id="extract")
    assert extract.last_failure_context["reason"] == "manual_clear"
    assert extract.last_failure_context["metadata"]["user"] == "tester"
    assert AuditLog.objects.filter(action="backfill_rerun", run_id=run.run_id).exists()


def test_reprocess_completed_clears_every_task_of_a_finished_run():
    dag = daily_dag()
    day = backfills.check(dag, start="2026-03-27", end="2026-03-27").dates[0]
    run = create_run(dag, run_type="scheduled", logical_date=day)
    TaskInstance.objects.filter(dag_run=run).update(state="success", try_number=1)
    DagRun.objects.filter(pk=run.pk).update(state="success")
    backfill = make(dag, "2026-03-27", "2026-03-27", reprocess="completed")
    engine.start_batch(backfill.pk, timezone.now())
    assert dict(TaskInstance.objects.filter(dag_run=run).values_list("task_id", "state")) == {"extract": "queued", "load": "none"}


def test_reprocess_none_skips_every_date_with_a_run():
    dag = daily_dag()
    day = backfills.check(dag, start="2026-03-27", end="2026-03-27").dates[0]
    run = create_run(dag, run_type="scheduled", logical_date=day)
    DagRun.objects.filter(pk=run.pk).update(state="failed")
    backfill = make(dag, "2026-03-27", "2026-03-28")
    assert list(backfill.dates.values_list("action", "state")) == [("skip", "skipped"), ("create", "pending")]


def test_a_run_that_became_active_meanwhile_is_left_alone():
    """Planned as a re-run, but started by someone else before the backfill got to it: skipped."""
    dag = daily_dag()
    day = backfills.check(dag, start="2026-03-27", end="2026-03-27").dates[0]
    run = create_run(dag, run_type="scheduled", logical_date=day)
    DagRun.objects.filter(pk=run.pk).update(state="failed")
    backfill = make(dag, "2026-03-27", "2026-03-27", reprocess="failed")
    DagRun.objects.filter(pk=run.pk).update(state="running")
    assert engine.start_batch(backfill.pk, timezone.now()) == 0
    assert backfill.dates.get().state == "skipped"
    run.refresh_from_db()
    assert run.backfill_id is None


@pytest.mark.parametrize("backwards", [False, True])
def test_it_starts_at_most_max_active_runs_oldest_first(backwards):
    dag = daily_dag()
    backfill = make(dag, "2026-03-27", "2026-03-31", max_active_runs=2, backwards=backwards)
    all_dates = sorted(backfills.check(dag, start="2026-03-27", end="2026-03-31").dates, reverse=backwards)
    seen = []
    for _ in range(3):
        schedule_once()
        active = list(DagRun.objects.filter(backfill=backfill, state__in=["queued", "running"]).order_by("logical_date"))
        assert len(active) <= 2
        seen.extend(r.logical_date for r in active)
        for run in active:
            finish(run.pk)
    assert started_dates(backfill) == all_dates
    schedule_once()
    backfill.refresh_from_db()
    assert backfill.state == "success"
    assert backfill.end_date is not None
    doc = backfills.document(backfill)
    assert doc["runs"] == {"total": 5, "pending": 0, "queued": 0, "running": 0, "success": 5, "failed": 0}
    assert set(DagRun.objects.filter(backfill=backfill).values_list("run_type", flat=True)) == {"backfill"}


def test_a_failed_run_fails_the_backfill():
    dag = daily_dag()
    backfill = make(dag, "2026-03-27", "2026-03-28")
    schedule_once()
    runs = list(DagRun.objects.filter(backfill=backfill))
    finish(runs[0].pk, "success")
    finish(runs[1].pk, "failed")
    schedule_once()
    backfill.refresh_from_db()
    assert backfill.state == "failed"
    assert backfills.document(backfill)["runs"]["failed"] == 1


def test_neither_limit_counts_the_others_runs():
    """The DAG's max_active_runs of 1 is full with a manual run; the backfill still starts its 3;
    and a scheduled run still starts while the backfill's runs are running."""
    dag = daily_dag(max_active_runs=1)
    manual = create_run(dag, run_type="manual", logical_date=timezone.now())
    advance_run(manual.pk)
    manual.refresh_from_db()
    assert manual.state == "running"
    backfill = make(dag, "2026-03-27", "2026-03-29", max_active_runs=3)
    schedule_once()
    assert DagRun.objects.filter(backfill=backfill, state="running").count() == 3
    finish(manual.pk)
    second = create_run(dag, run_type="manual", logical_date=timezone.now())
    advance_run(second.pk)
    second.refresh_from_db()
    assert second.state == "running"


def test_a_paused_dag_is_backfilled_and_stays_paused():
    dag = daily_dag(paused=True)
    backfill = make(dag, "2026-03-27", "2026-03-27")
    schedule_once()
    run = DagRun.objects.get(backfill=backfill)
    assert run.state == "running"
    assert TaskInstance.objects.get(dag_run=run, task_id="extract").state == "queued"
    TaskInstance.objects.filter(dag_run=run, task_id="extract").update(state="success")
    schedule_once()
    assert TaskInstance.objects.get(dag_run=run, task_id="load").state == "queued"
    dag.refresh_from_db()
    assert dag.paused


def test_pause_holds_new_runs_and_unpause_releases_them():
    dag = daily_dag()
    backfill = make(dag, "2026-03-27", "2026-03-30", max_active_runs=1)
    schedule_once()
    first = DagRun.objects.get(backfill=backfill)
    backfills.act(backfill, "pause", None)
    finish(first.pk)
    for _ in range(2):
        schedule_once()
    assert DagRun.objects.filter(backfill=backfill).count() == 1
    assert backfills.document(Backfill.objects.get(pk=backfill.pk))["runs"]["pending"] == 3
    backfills.act(backfill, "unpause", None)
    schedule_once()
    assert DagRun.objects.filter(backfill=backfill, state="running").count() == 1
    assert [a.action for a in AuditLog.objects.filter(action__startswith="backfill_").order_by("id")] == [
        "backfill_create", "backfill_pause", "backfill_unpause",
    ]


def test_cancel_never_starts_the_rest_and_lets_running_runs_finish():
    dag = daily_dag()
    backfill = make(dag, "2026-03-27", "2026-03-31", max_active_runs=2)
    schedule_once()
    running = list(DagRun.objects.filter(backfill=backfill))
    assert len(running) == 2
    backfill = backfills.act(backfill, "cancel", None)
    assert backfill.state == "cancelled"
    assert not backfills.is_over(backfill)  # two runs still going
    for _ in range(2):
        schedule_once()
    assert DagRun.objects.filter(backfill=backfill).count() == 2
    for run in running:
        finish(run.pk)
    backfill.refresh_from_db()
    assert backfills.is_over(backfill)
    doc = backfills.document(backfill)
    assert doc["state"] == "cancelled"
    assert doc["cancelled"] == 3
    assert doc["runs"] == {"total": 5, "pending": 0, "queued": 0, "running": 0, "success": 2, "failed": 0}
    with pytest.raises(backfills.Conflict):
        backfills.act(backfill, "unpause", None)


def test_a_backfill_run_gets_only_deadlines_from_its_own_queue_time():
    dag = daily_dag()
    for reference in ("dagrun_queued_at", "dagrun_logical_date"):
        DeadlineDefinition.objects.create(dag=dag, reference=reference, interval=3600, callback="notifier:log")
    backfill = make(dag, "2026-03-27", "2026-03-27")
    schedule_once()
    run = DagRun.objects.get(backfill=backfill)
    assert list(Deadline.objects.filter(dag_run=run).values_list("reference", flat=True)) == ["dagrun_queued_at"]


# --- the command -------------------------------------------------------------------------------


def run_command(*args):
    import io

    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("backfill", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        return exc.code, out.getvalue()
    return 0, out.getvalue()


def test_the_command_prints_the_id_first_and_a_dry_run_prints_each_date():
    dag = daily_dag()
    code, out = run_command(dag.dag_id, "--from", "2026-03-28", "--to", "2026-03-30", "--dry-run")
    assert code == 0
    assert out.splitlines() == [
        "2026-03-27T23:00:00+00:00 create",
        "2026-03-28T23:00:00+00:00 create",
        "2026-03-29T22:00:00+00:00 create",
    ]
    assert not Backfill.objects.exists()
    code, out = run_command(dag.dag_id, "--from", "2026-03-28", "--to", "2026-03-30", "--max-active-runs", "2", "--backwards", "--conf", '{"k": 1}')
    backfill = Backfill.objects.get()
    assert out.splitlines()[0] == str(backfill.pk)
    assert (backfill.max_active_runs, backfill.backwards, backfill.conf, backfill.created_by) == (2, True, {"k": 1}, "cli")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--from", "yesterday", "--to", "2026-03-30"], "--from"),
        (["--from", "2026-03-28", "--to", "2026-13-01"], "--to"),
        (["--from", "2026-03-30", "--to", "2026-03-28"], "--from"),
        (["--from", "2026-03-28", "--to", "2026-03-30", "--reprocess", "all"], "--reprocess"),
        (["--from", "2026-03-28", "--to", "2026-03-30", "--max-active-runs", "0"], "--max-active-runs"),
        (["--from", "2026-03-28", "--to", "2026-03-30", "--max-active-runs", "ten"], "--max-active-runs"),
        (["--from", "2026-03-28", "--to", "2026-03-30", "--conf", "[1]"], "--conf"),
        (["--from", "2026-03-28\x00", "--to", "2026-03-30"], "--from"),
        (["--from", "2020-01-01", "--to", "2026-03-30"], "--to"),  # more than 1000 dates
    ],
)
def test_a_bad_argument_is_an_error_naming_it_and_creates_nothing(args, named):
    from django.core.management import CommandError

    dag = daily_dag()
    with pytest.raises(CommandError) as caught:
        run_command(dag.dag_id, *args)
    assert named in str(caught.value)
    assert not Backfill.objects.exists()
    assert not DagRun.objects.exists()


def test_a_dag_without_a_schedule_cannot_be_backfilled():
    from django.core.management import CommandError

    dag = DagFactory(schedule=None)
    with pytest.raises(CommandError, match="DAG_ID: DAG .* has no schedule"):
        run_command(dag.dag_id, "--from", "2026-03-28", "--to", "2026-03-30")
    with pytest.raises(CommandError, match="unknown DAG"):
        run_command("nope", "--from", "2026-03-28", "--to", "2026-03-30")
    assert not Backfill.objects.exists()


def test_the_limit_on_dates_is_a_setting(settings):
    settings.ORCHESTRATOR_BACKFILL_MAX_RUNS = 3
    dag = daily_dag()
    with pytest.raises(backfills.BackfillError, match="more than ORCHESTRATOR_BACKFILL_MAX_RUNS"):
        backfills.check(dag, start="2026-03-27", end="2026-03-30")
    assert len(backfills.check(dag, start="2026-03-27", end="2026-03-29").dates) == 3


def test_a_backfill_run_cleared_after_the_end_runs_again_on_a_paused_dag():
    """An operator's clear of a finished backfill run reopens it, and the scheduler moves it on
    although the DAG is paused: nothing stuck."""
    from orchestrator.operations import actions

    dag = daily_dag(paused=True)
    backfill = make(dag, "2026-03-27", "2026-03-27")
    schedule_once()
    run = DagRun.objects.get(backfill=backfill)
    finish(run.pk, "failed")
    schedule_once()
    assert Backfill.objects.get(pk=backfill.pk).state == "failed"
    extract = TaskInstance.objects.select_related("dag_run__dag", "definition").get(dag_run=run, task_id="extract")
    actions.clear(extract, None)
    schedule_once()
    run.refresh_from_db()
    assert run.state == "running"
    assert TaskInstance.objects.get(dag_run=run, task_id="extract").state == "queued"


def test_a_rerun_clears_as_an_operator_does_emptying_the_task_state_each_clear_audited_by_the_creator():
    """A re-run's clear is an operator's clear: fresh tries, the task state emptied (so a
    resumable task gets a new idempotency key and submits anew, instead of finding its old job
    and answering already_succeeded), and an audit entry per cleared task naming the creator."""
    from orchestrator.engine import task_state_store
    from orchestrator.models import TaskStateEntry

    dag = daily_dag()
    day = backfills.check(dag, start="2026-03-27", end="2026-03-27").dates[0]
    run = create_run(dag, run_type="scheduled", logical_date=day)
    TaskInstance.objects.filter(dag_run=run).update(state="success", try_number=1)
    extract = TaskInstance.objects.get(dag_run=run, task_id="extract")
    TaskStateEntry.objects.create(
        task_instance=extract, key="job_id", value="job-1", written_at=timezone.now(), attempt_token=1, try_number=1, infrastructure_try_number=0
    )
    key_before = task_state_store.start(extract.pk, dag.dag_id, run.run_id, "extract").idempotency_key
    DagRun.objects.filter(pk=run.pk).update(state="success", end_date=timezone.now())
    backfill = make(dag, "2026-03-27", "2026-03-27", reprocess="completed")
    assert engine.start_batch(backfill.pk, timezone.now()) == 1
    assert not TaskStateEntry.objects.filter(task_instance__dag_run=run).exists()
    assert task_state_store.start(extract.pk, dag.dag_id, run.run_id, "extract").idempotency_key != key_before
    clears = AuditLog.objects.filter(action="clear", run_id=run.run_id)
    assert sorted(clears.values_list("task_id", "username", "prior_state", "new_state")) == [
        ("extract", "tester", "success", "none"), ("load", "tester", "success", "none")
    ]
    assert all(entry.details["keep_task_state"] is False and f"backfill {backfill.pk}" in entry.details["note"] for entry in clears)


def test_its_counts_are_one_read_so_a_date_is_never_both_pending_and_running(django_assert_num_queries):
    """Two reads let a date that started between them count as pending and as running at once
    ("3 running, 3 pending" for a backfill of three dates)."""
    dag = daily_dag()
    backfill = make(dag, start="2026-03-27", end="2026-03-29")
    with django_assert_num_queries(1):
        before = engine.run_counts(backfill.pk)
    assert (before["total"], before["pending"], before["running"] + before["queued"]) == (3, 3, 0)
    schedule_once()
    after = engine.run_counts(backfill.pk)
    assert after["total"] == 3
    assert after["pending"] + after["queued"] + after["running"] == 3, after
