"""db_clean and the scheduler's clean-up: old finished runs go with everything that hangs from
them; running runs, recent runs, audit entries and the failure counts of what stays do not."""
from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db.models import Sum
from django.utils import timezone

from deadlines.models import Deadline
from orchestrator.engine import reporting
from orchestrator.engine.run_creation import create_manual_run
from orchestrator.engine.scheduler import _Cleaning, schedule_once
from orchestrator.models import AuditLog, DagRun, FailureCount, TaskAttempt, TaskInstance
from retries.context import ExecutionContext
from retries.states import Reason, Source
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("empty_default_queue")]

WORKER = reporting.WorkerInfo(hostname="test-host", worker_name="test-worker", pid=1)


def _finished_run(dag, *, fail: bool, ended_days_ago: float) -> DagRun:
    """A run of one task that succeeded, or failed for good; its end moved into the past."""
    run = create_manual_run(dag)
    ti = TaskInstance.objects.get(dag_run=run)
    reporting.claim(ti.pk, ti.attempt_token, WORKER)
    reporting.mark_running(ti.pk, ti.attempt_token)
    if fail:
        reporting.report_failure(ti.pk, ti.attempt_token, ExecutionContext.of(Reason.NON_RETRYABLE, Source.WORKER))
    else:
        reporting.report_success(ti.pk, ti.attempt_token, stdout="hello")
    run.refresh_from_db()
    assert run.state == ("failed" if fail else "success")
    DagRun.objects.filter(pk=run.pk).update(end_date=timezone.now() - timedelta(days=ended_days_ago))
    return run


def _counted_failures() -> int:
    return FailureCount.objects.aggregate(n=Sum("n"))["n"] or 0


def _dag():
    dag = DagFactory(default_args={"retry_delay": 0.1})
    TaskFactory(dag=dag, task_id="only")
    return dag


def test_it_deletes_old_finished_runs_with_what_hangs_from_them():
    dag = _dag()
    old_ok = _finished_run(dag, fail=False, ended_days_ago=40)
    old_failed = _finished_run(dag, fail=True, ended_days_ago=40)
    recent = _finished_run(dag, fail=True, ended_days_ago=1)
    running = create_manual_run(dag)  # unfinished: never touched, however old
    DagRun.objects.filter(pk=running.pk).update(queued_at=timezone.now() - timedelta(days=90))
    AuditLog.objects.create(action="clear", dag_id=dag.dag_id, run_id=old_failed.run_id, task_id="only")
    assert _counted_failures() == 2

    out = StringIO()
    call_command("db_clean", "--older-than", "30", stdout=out)

    assert set(DagRun.objects.values_list("pk", flat=True)) == {recent.pk, running.pk}
    assert not TaskInstance.objects.filter(dag_run__in=[old_ok.pk, old_failed.pk]).exists()
    assert TaskAttempt.objects.filter(task_instance__dag_run=recent).count() == 1
    assert not Deadline.objects.exclude(dag_run__in=[recent.pk, running.pk]).exists()
    # The counts agree with the failed attempts that are left; the audit trail stays.
    assert _counted_failures() == TaskAttempt.objects.filter(state="failed").count() == 1
    assert AuditLog.objects.filter(run_id=old_failed.run_id).exists()
    assert "done: deleted 2 runs, 2 task instances, 2 attempts" in out.getvalue()


def test_it_keeps_failed_runs_longer_and_changes_nothing_on_a_dry_run():
    dag = _dag()
    _finished_run(dag, fail=False, ended_days_ago=40)
    failed = _finished_run(dag, fail=True, ended_days_ago=40)
    out = StringIO()
    call_command("db_clean", "--older-than", "30", "--dry-run", stdout=out)
    assert "would delete 2 runs, 2 task instances, 2 attempts" in out.getvalue()
    assert DagRun.objects.count() == 2
    call_command("db_clean", "--older-than", "30", "--keep-failed-days", "60", stdout=StringIO())
    assert list(DagRun.objects.values_list("pk", flat=True)) == [failed.pk]
    assert _counted_failures() == 1


@pytest.mark.parametrize("value", ["-1", "soon", "nan", "inf", "1\x00"])
def test_it_refuses_bad_days(value):
    with pytest.raises(CommandError, match="days must be"):
        call_command("db_clean", "--older-than", value, stdout=StringIO())


def test_it_works_in_many_small_transactions():
    """Each transaction deletes a bounded batch; a run's row goes only after its task instances."""
    from orchestrator.engine import retention

    dag = DagFactory()
    for i in range(30):
        TaskFactory(dag=dag, task_id=f"t{i}")
    run = create_manual_run(dag)
    DagRun.objects.filter(pk=run.pk).update(state="success", end_date=timezone.now() - timedelta(days=9))
    cutoff, failed_cutoff = retention.cutoffs(timezone.now(), 5, None)
    seen = []
    bounds = retention.MIN_BATCH, retention.MAX_BATCH
    retention.MIN_BATCH = retention.MAX_BATCH = 7  # the batch would grow on a fast database
    try:
        report = retention.clean(cutoff, failed_cutoff, batch=7, progress=lambda r: seen.append((r.task_instances, r.runs)))
    finally:
        retention.MIN_BATCH, retention.MAX_BATCH = bounds
    assert seen[:5] == [(7, 0), (14, 0), (21, 0), (28, 0), (30, 0)]
    assert seen[-1] == (30, 1)
    assert report.transactions == 6
    assert not DagRun.objects.exists()


def test_the_scheduler_cleans_when_retention_is_set(settings):
    dag = _dag()
    _finished_run(dag, fail=False, ended_days_ago=10)
    settings.ORCHESTRATOR_RETENTION_DAYS = 0
    _Cleaning.next_at = 0.0
    schedule_once()
    assert DagRun.objects.count() == 1  # off by default
    settings.ORCHESTRATOR_RETENTION_DAYS = 7
    schedule_once()
    assert DagRun.objects.count() == 0


def test_it_deletes_the_stored_output_of_the_attempts_it_deletes(settings, tmp_path):
    """The output store's files of deleted attempts go too; those of the runs kept stay."""
    from orchestrator.foundation.outputstore import FileStore

    settings.ORCHESTRATOR_TASK_OUTPUT_DIR = str(tmp_path / "output")
    store = FileStore(settings.ORCHESTRATOR_TASK_OUTPUT_DIR, 1 << 20)
    dag = _dag()
    old = _finished_run(dag, fail=False, ended_days_ago=40)
    recent = _finished_run(dag, fail=False, ended_days_ago=1)
    keys = {}
    for run in (old, recent):
        attempt = TaskAttempt.objects.get(task_instance__dag_run=run)
        keys[run.pk] = (attempt.task_instance_id, attempt.attempt_token)
        writer = store.open_writer(keys[run.pk])
        writer.write("stdout", b"out of " + run.run_id.encode())
        writer.write("stderr", b"err")
        writer.close()
    assert store.size(keys[old.pk], "stdout")
    assert store.size(keys[old.pk], "stderr") == 3

    call_command("db_clean", "--older-than", "30", stdout=StringIO())

    assert store.size(keys[old.pk], "stdout") is None
    assert store.size(keys[old.pk], "stderr") is None
    assert store.read(keys[recent.pk], "stdout", 0, 100) == b"out of " + recent.run_id.encode()
    assert not store.path(keys[old.pk], "stdout").exists()


def test_a_slow_transaction_shrinks_the_next_batch_at_once():
    """Over the target (half the lock budget) the batch becomes what would have fit, in one step."""
    from orchestrator.engine.retention import MAX_BATCH, MIN_BATCH, next_batch

    assert next_batch(3000, elapsed=1.5, lock_budget=1.0) == 1000
    assert next_batch(3000, elapsed=30.0, lock_budget=1.0) == MIN_BATCH
    assert next_batch(3000, elapsed=0.51, lock_budget=1.0) < 3000
    assert next_batch(1000, elapsed=0.01, lock_budget=1.0) == 2000
    assert next_batch(MAX_BATCH, elapsed=0.01, lock_budget=1.0) == MAX_BATCH
    assert next_batch(1000, elapsed=0.3, lock_budget=1.0) == 1000


def test_the_pause_keeps_the_share_of_time_working_at_the_duty():
    from orchestrator.engine.retention import pause_after

    assert pause_after(0.2, 0.5) == pytest.approx(0.2)
    assert pause_after(0.2, 0.25) == pytest.approx(0.6)
    assert pause_after(0.2, 1.0) == 0


def test_it_pauses_after_each_transaction_in_proportion_to_its_time():
    """With a duty of 0.5 it pauses about as long as it worked, after every transaction."""
    import time

    from orchestrator.engine import retention

    dag = DagFactory()
    for i in range(12):
        TaskFactory(dag=dag, task_id=f"t{i}")
    run = create_manual_run(dag)
    DagRun.objects.filter(pk=run.pk).update(state="success", end_date=timezone.now() - timedelta(days=9))
    cutoff, failed_cutoff = retention.cutoffs(timezone.now(), 5, None)
    pauses: list[tuple[float, float]] = []  # (the pause, the time worked since the last one)
    last = [time.monotonic()]

    def pause(seconds: float) -> None:
        pauses.append((seconds, time.monotonic() - last[0]))
        time.sleep(seconds)
        last[0] = time.monotonic()

    report = retention.clean(cutoff, failed_cutoff, batch=5, duty=0.5, pause=pause)
    assert not DagRun.objects.exists()
    assert len(pauses) == report.transactions >= 3
    assert report.paused == pytest.approx(sum(p for p, _ in pauses))
    for paused, worked in pauses:
        assert 0.5 * worked <= paused <= worked


@pytest.mark.parametrize("value", ["0", "-0.5", "1.5", "often", "nan", "0.5\x00"])
def test_it_refuses_a_bad_duty_and_changes_nothing(value):
    dag = _dag()
    _finished_run(dag, fail=False, ended_days_ago=10)
    with pytest.raises(CommandError, match="--max-duty must be"):
        call_command("db_clean", "--older-than", "5", "--max-duty", value, stdout=StringIO())
    assert DagRun.objects.count() == 1


def test_a_duty_of_one_never_pauses():
    dag = _dag()
    _finished_run(dag, fail=False, ended_days_ago=10)
    out = StringIO()
    call_command("db_clean", "--older-than", "5", "--max-duty", "1", stdout=out)
    assert "deleted 1 runs" in out.getvalue()
    assert "paused 0.0 s" in out.getvalue()


# --- every row a run can have, and a run that cannot be deleted -------------------------------


def _run_with_every_dependent_row(dag, tmp_path, settings) -> tuple[DagRun, list]:
    """An old failed run with a row of every kind that hangs from a run (and an output file);
    returns it with the output store's keys of its attempts."""
    from deadlines.models import Deadline
    from orchestrator.foundation.outputstore import FileStore
    from orchestrator.models import Backfill, BackfillDate, TaskStateEntry, TaskWait

    settings.ORCHESTRATOR_TASK_OUTPUT_DIR = str(tmp_path / "output")
    run = _finished_run(dag, fail=True, ended_days_ago=40)
    ti = TaskInstance.objects.get(dag_run=run)
    attempt = TaskAttempt.objects.get(task_instance=ti)
    now = timezone.now()
    TaskStateEntry.objects.create(
        task_instance=ti, key="job", value={"id": 7}, written_at=now, attempt_token=attempt.attempt_token, try_number=1, infrastructure_try_number=0
    )
    # A rescheduled task's wait row stays after its last try: it hangs from the run too.
    TaskWait.objects.create(task_instance=ti, kind="reschedule", attempt_token=attempt.attempt_token, since=now, timeout_at=now)
    Deadline.objects.create(dag_run=run, reference="dagrun_queued_at", callback="x.y", need_by=now)
    Deadline.objects.create(dag_run=run, task_instance=ti, scope="task", task_id="only", reference="task_started_at", callback="x.y", need_by=now)
    backfill = Backfill.objects.create(dag=dag, from_date=now, to_date=now, created_by="alice", created_at=now)
    BackfillDate.objects.create(backfill=backfill, logical_date=run.logical_date, action="rerun", state="started", dag_run=run)
    AuditLog.objects.create(action="clear", dag_id=dag.dag_id, run_id=run.run_id, task_id="only")
    store = FileStore(settings.ORCHESTRATOR_TASK_OUTPUT_DIR, 1 << 20)
    key = (attempt.task_instance_id, attempt.attempt_token)
    writer = store.open_writer(key)
    writer.write("stdout", b"old output")
    writer.close()
    return run, [key]


# The models whose rows hang from a run (a foreign key to it, or to one of them): what the test
# above makes one of each. A new one must be added there, so that retention is tested with it.
HANGING_FROM_A_RUN = {"TaskInstance", "TaskAttempt", "TaskStateEntry", "TaskWait", "Deadline", "BackfillDate"}


def _hanging_from(model, seen=None) -> set[str]:
    seen = set() if seen is None else seen
    for rel in model._meta.related_objects:
        name = rel.related_model.__name__
        if name not in seen:
            seen.add(name)
            _hanging_from(rel.related_model, seen)
    return seen


def test_the_test_makes_a_row_of_every_kind_that_hangs_from_a_run():
    assert _hanging_from(DagRun) == HANGING_FROM_A_RUN


def test_it_deletes_a_run_with_every_kind_of_row_that_can_hang_from_it(settings, tmp_path):
    """Task state, attempts, deadlines of the run and of its tasks, a backfill's date, failure
    counts and stored output: all deleted (the backfill's date let go of it), the audit kept."""
    from orchestrator.foundation.outputstore import FileStore
    from orchestrator.models import BackfillDate, TaskStateEntry

    dag = _dag()
    old, keys = _run_with_every_dependent_row(dag, tmp_path, settings)
    recent = _finished_run(dag, fail=False, ended_days_ago=1)
    assert _counted_failures() == 1

    out = StringIO()
    call_command("db_clean", "--older-than", "30", stdout=out)

    assert list(DagRun.objects.values_list("pk", flat=True)) == [recent.pk]
    assert not TaskStateEntry.objects.exists()
    assert not Deadline.objects.exists()
    assert TaskAttempt.objects.filter(task_instance__dag_run=recent).count() == TaskAttempt.objects.count() == 1
    assert BackfillDate.objects.get().dag_run_id is None
    assert _counted_failures() == 0
    assert AuditLog.objects.filter(run_id=old.run_id).exists()
    assert FileStore(settings.ORCHESTRATOR_TASK_OUTPUT_DIR, 1 << 20).size(keys[0], "stdout") is None
    assert "done: deleted 1 runs, 1 task instances, 1 attempts" in out.getvalue()


@pytest.fixture
def undeletable_run():
    """Makes a run undeletable: a row of a table the application does not know of refers to it."""
    from django.db import connection

    made = []

    def make(run: DagRun) -> DagRun:
        with connection.cursor() as cursor:
            if not made:
                cursor.execute("CREATE TABLE retention_test_hold (run_id bigint NOT NULL REFERENCES orchestrator_dagrun (id))")
                made.append(True)
            cursor.execute("INSERT INTO retention_test_hold (run_id) VALUES (%s)", [run.pk])
        return run

    yield make
    if made:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE retention_test_hold")


def test_a_run_that_cannot_be_deleted_is_skipped_with_one_warning_and_blocks_nothing(settings, tmp_path, undeletable_run, caplog):
    """The oldest run cannot be deleted: its batch fails, is retried run by run, the others go;
    it is skipped with one warning (no traceback), and the scheduler's next passes say no more."""
    import logging

    dag = _dag()
    stuck, _ = _run_with_every_dependent_row(dag, tmp_path, settings)
    undeletable_run(stuck)
    others = [_finished_run(dag, fail=fail, ended_days_ago=35) for fail in (False, True, False)]
    settings.ORCHESTRATOR_RETENTION_DAYS = 30
    _Cleaning.next_at = 0.0
    _Cleaning.undeletable = set()
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            _Cleaning.next_at = 0.0
            schedule_once()

    assert list(DagRun.objects.values_list("pk", flat=True)) == [stuck.pk]
    assert not TaskInstance.objects.filter(dag_run__in=[r.pk for r in others]).exists()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("orchestrator")]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert str(stuck.pk) in warnings[0].getMessage()
    assert warnings[0].exc_info is None
    assert _counted_failures() == 0  # its task instances went in transactions of their own


def test_db_clean_skips_a_run_it_cannot_delete_and_says_so(settings, tmp_path, undeletable_run):
    dag = _dag()
    stuck = undeletable_run(_finished_run(dag, fail=False, ended_days_ago=40))
    other = _finished_run(dag, fail=False, ended_days_ago=39)
    out = StringIO()
    call_command("db_clean", "--older-than", "30", stdout=out)
    assert list(DagRun.objects.values_list("pk", flat=True)) == [stuck.pk]
    assert not DagRun.objects.filter(pk=other.pk).exists()
    assert "deleted 1 runs" in out.getvalue()
    assert "skipped 1 runs" in out.getvalue()
