"""Backfills with real schedulers (two at once) and a real worker: the dates the tasks see across
a daylight-saving change, the backfill's limit as the tasks observe it, every reprocess behaviour,
pause, unpause and cancel mid-way with nothing left stuck, a paused DAG."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.models import Backfill, Dag, DagRun, TaskInstance
from orchestrator.operations import backfills
from tests.backfills.tasks import intervals, most_at_once
from tests.conftest import ROOT, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration, pytest.mark.timeout(300)]

SCHEDULER_ENV = {"ORCHESTRATOR_SCHEDULER_INTERVAL": "0.2"}
# Local midnight in Amsterdam from 27 March to 1 April 2026: the clocks go forward on the 29th.
AMSTERDAM_MIDNIGHTS = [
    "2026-03-26T23:00:00+00:00",
    "2026-03-27T23:00:00+00:00",
    "2026-03-28T23:00:00+00:00",
    "2026-03-29T22:00:00+00:00",
    "2026-03-30T22:00:00+00:00",
    "2026-03-31T22:00:00+00:00",
]


@pytest.fixture
def stack(spawn, worker):
    """Two schedulers and one worker."""
    worker()
    spawn("run_scheduler", env=SCHEDULER_ENV)
    spawn("run_scheduler", env=SCHEDULER_ENV)


def daily_dag(make_dag, log: Path, seconds: float = 0.5, **fields) -> Dag:
    dag = make_dag([{"task_id": "work", "python_callable": "tests.backfills.tasks.record", "op_kwargs": {"log": str(log), "seconds": seconds}}])
    Dag.objects.filter(pk=dag.pk).update(schedule="0 0 * * *", timezone="Europe/Amsterdam", **fields)
    dag.refresh_from_db()
    return dag


def nothing_stuck(dag: Dag) -> None:
    assert not DagRun.objects.filter(dag=dag, state__in=["queued", "running"]).exists()
    assert set(TaskInstance.objects.filter(dag_run__dag=dag).values_list("state", flat=True)) <= {"success", "failed"}


def test_a_backfill_runs_each_date_once_within_its_limit_across_dst(stack, make_dag, process_env, tmp_path):
    log = tmp_path / "calls.log"
    dag = daily_dag(make_dag, log)
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "backfill", dag.dag_id, "--from", "2026-03-27", "--to", "2026-04-01", "--max-active-runs", "2", "--wait"],
        env=process_env, cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    backfill = Backfill.objects.get()
    assert lines[0] == str(backfill.pk)
    assert lines[-1] == "success"
    spans = intervals(str(log))
    # Every date once, each seen by its task as its local midnight; never more than 2 at once,
    # and 2 at once at some point (the limit is what held them back, not the worker).
    assert sorted(date for _, _, date in spans) == AMSTERDAM_MIDNIGHTS
    assert most_at_once(spans) == 2
    runs = DagRun.objects.filter(dag=dag)
    assert set(runs.values_list("run_type", "backfill_id", "state")) == {("backfill", backfill.pk, "success")}
    assert backfills.document(backfill)["runs"] == {"total": 6, "pending": 0, "queued": 0, "running": 0, "success": 6, "failed": 0}
    nothing_stuck(dag)


def test_every_reprocess_behaviour_on_a_paused_dag(stack, make_dag, process_env, tmp_path):
    log = tmp_path / "calls.log"
    dag = daily_dag(make_dag, log, seconds=0.1, paused=True)
    second_day = AMSTERDAM_MIDNIGHTS[1]
    Path(f"{log}.fail-{second_day}").touch()

    def backfill(reprocess: str) -> Backfill:
        created = backfills.create(backfills.check(dag, start="2026-03-27", end="2026-03-29", reprocess=reprocess, max_active_runs=3), None)
        wait_until(lambda: backfills.is_over(Backfill.objects.get(pk=created.pk)), timeout=90, message=f"the {reprocess} backfill to end")
        return Backfill.objects.get(pk=created.pk)

    def calls() -> dict[str, int]:
        counted: dict[str, int] = {}
        for _, _, date in intervals(str(log)):
            counted[date] = counted.get(date, 0) + 1
        return counted

    # The first through the command: --wait ends with the state, exit 1 as a run failed.
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "backfill", dag.dag_id, "--from", "2026-03-27", "--to", "2026-03-29", "--max-active-runs", "3", "--wait"],
        env=process_env, cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "failed"
    first = Backfill.objects.get()
    assert first.state == "failed"
    assert calls() == {AMSTERDAM_MIDNIGHTS[0]: 1, second_day: 1, AMSTERDAM_MIDNIGHTS[2]: 1}
    Path(f"{log}.fail-{second_day}").unlink()

    again = backfill("none")  # every date has a run: nothing to do
    assert again.state == "success"
    assert backfills.document(again)["skipped"] == 3
    rerun_failed = backfill("failed")  # only the failed date runs again
    assert rerun_failed.state == "success"
    assert calls() == {AMSTERDAM_MIDNIGHTS[0]: 1, second_day: 2, AMSTERDAM_MIDNIGHTS[2]: 1}
    rerun_all = backfill("completed")  # every date runs again
    assert rerun_all.state == "success"
    assert calls() == {AMSTERDAM_MIDNIGHTS[0]: 2, second_day: 3, AMSTERDAM_MIDNIGHTS[2]: 2}
    assert DagRun.objects.filter(dag=dag).count() == 3  # re-runs, never duplicates
    dag.refresh_from_db()
    assert dag.paused
    assert not DagRun.objects.filter(dag=dag, run_type="scheduled").exists()
    nothing_stuck(dag)


def test_pause_unpause_and_cancel_mid_way_leave_nothing_stuck(stack, make_dag, tmp_path):
    log = tmp_path / "calls.log"
    dag = daily_dag(make_dag, log, seconds=1.5)
    backfill = backfills.create(backfills.check(dag, start="2026-03-27", end="2026-04-01", max_active_runs=1), None)
    first = wait_until(lambda: DagRun.objects.filter(backfill=backfill).first(), timeout=30, message="the first run")
    backfills.act(backfill, "pause", None)
    wait_until(lambda: DagRun.objects.get(pk=first.pk).state == "success", timeout=60, message="the running run to finish")
    # Paused: the scheduler passes go by and nothing else starts.
    wait_until(lambda: len(intervals(str(log))) == 1, timeout=10)
    import time

    time.sleep(1.5)
    assert DagRun.objects.filter(backfill=backfill).count() == 1
    assert backfills.document(Backfill.objects.get(pk=backfill.pk))["runs"]["pending"] == 5
    backfills.act(backfill, "unpause", None)
    second = wait_until(lambda: DagRun.objects.filter(backfill=backfill).exclude(pk=first.pk).first(), timeout=30, message="the next run")
    backfills.act(backfill, "cancel", None)
    wait_until(lambda: backfills.is_over(Backfill.objects.get(pk=backfill.pk)), timeout=60, message="the cancelled backfill's run to finish")
    time.sleep(1)
    assert DagRun.objects.get(pk=second.pk).state == "success"  # the running one finished
    assert DagRun.objects.filter(backfill=backfill).count() == 2  # the rest never started
    doc = backfills.document(Backfill.objects.get(pk=backfill.pk))
    assert doc["state"] == "cancelled"
    assert doc["cancelled"] == 4
    assert doc["runs"] == {"total": 6, "pending": 0, "queued": 0, "running": 0, "success": 2, "failed": 0}
    nothing_stuck(dag)


def test_two_schedulers_at_once_never_exceed_the_limit(spawn, make_dag, tmp_path):
    """No worker: the runs stay running, and two schedulers racing over the backfill start 3 of
    its 10 dates between them, however many passes they make."""
    dag = daily_dag(make_dag, tmp_path / "calls.log")
    backfill = backfills.create(backfills.check(dag, start="2026-03-20", end="2026-03-29", max_active_runs=3), None)
    for _ in range(2):
        procs = [spawn("run_scheduler", "--once"), spawn("run_scheduler", "--once")]
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, out
        assert DagRun.objects.filter(backfill=backfill).count() == 3
    assert backfills.document(Backfill.objects.get(pk=backfill.pk))["runs"]["pending"] == 7
