"""RemoteJob against the example job service (an HTTP server in this test process that runs
each job for a few seconds and records every submit and cancel), driven by real workers."""
from __future__ import annotations

import os
import signal

import pytest

from orchestrator.data import metrics
from orchestrator.operations import actions
from orchestrator.operations.documents import run_document
from tests.conftest import wait_until
from tests.faults.conftest import alive, task_processes
from tests.faults.invariants import assert_invariants, attempts_of, remote_job_violations
from tests.worker.conftest import instance, settle, trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

EXPORT = "tests.resume.tasks.Export"


def _export(job_service, **op_kwargs):
    return {"task_id": "export", "python_callable": EXPORT, "op_kwargs": {"service_url": job_service.url, **op_kwargs}}


def _resumes(ti):
    return [a.resume for a in ti.attempts.order_by("attempt_token")]


def _submitted(job_service, timeout=30):
    return wait_until(lambda: job_service.new_submits(), timeout=timeout, message="the job submitted")[0]


def test_kill_9_of_the_worker_mid_job_reattaches(worker, make_dag, job_service):
    """The platform retry re-attaches to the running job: one submit, no cancel, the job's
    result, user try 1 after one platform retry."""
    before = dict((labels["decision"], n) for labels, n in metrics.read(metrics.RESUME_DECISIONS))
    dag = make_dag([_export(job_service, seconds=300)], retries=0)
    run = trigger(dag)
    doomed = worker()
    job = _submitted(job_service)
    wait_until(lambda: instance(run, "export").attempts.filter(resume="submitted").exists(), timeout=10, message="decision recorded")
    pids = task_processes(doomed.pid)
    os.kill(doomed.pid, signal.SIGKILL)
    wait_until(lambda: not any(alive(p) for p in pids), timeout=10, message="the task process gone with its worker")
    worker()
    wait_until(lambda: settle(run, "export", ("running",), timeout=60).attempts.filter(resume="reattached").exists(), timeout=30, message="re-attached")
    job_service.finish(job["id"])
    ti = settle(run, "export", ("success", "failed"), timeout=60)
    assert ti.state == "success"
    assert attempts_of(ti) == [("platform", "failed", "worker_lost", 1, 0), ("user", "success", None, 1, 1)]
    assert _resumes(ti) == ["submitted", "reattached"]
    assert (ti.try_number, ti.infrastructure_try_number) == (1, 1)
    assert len(job_service.new_submits()) == 1
    assert job_service.events("cancel") == []
    doc = next(t for t in run_document(run)["task_instances"] if t["task_id"] == "export")
    assert doc["attempts"][-1]["result"] == {"job_id": job["id"], "rows": 1000}
    assert [a["resume"] for a in doc["attempts"]] == ["submitted", "reattached"]
    assert doc["task_state"] == {"remote_job_id": job["id"]}
    after = dict((labels["decision"], n) for labels, n in metrics.read(metrics.RESUME_DECISIONS))
    assert after.get("submitted", 0) - before.get("submitted", 0) == 1
    assert after.get("reattached", 0) - before.get("reattached", 0) == 1
    assert_invariants([run], remote_jobs=job_service.ledger(), operator_actions=True)


def test_sigterm_of_the_worker_leaves_the_job_running(worker, make_dag, job_service):
    """A worker stopped by SIGTERM stops its task as worker_termination: on_kill leaves the job
    running (and says so), and another worker re-attaches."""
    dag = make_dag([_export(job_service, seconds=300)], retries=0)
    run = trigger(dag)
    stopping = worker(ORCHESTRATOR_WORKER_SHUTDOWN_GRACE="0.5")
    job = _submitted(job_service)
    wait_until(lambda: instance(run, "export").attempts.filter(resume="submitted").exists(), timeout=10, message="decision recorded")
    os.kill(stopping.pid, signal.SIGTERM)
    ti = settle(run, "export", ("scheduled", "queued", "running", "success"), timeout=30)
    wait_until(lambda: instance(run, "export").attempts.count() == 2, timeout=30, message="a platform retry")
    first = instance(run, "export").attempts.order_by("attempt_token").first()
    assert first.context["reason"] == "worker_termination"
    assert "leaving remote job" in first.stderr
    worker()
    wait_until(lambda: settle(run, "export", ("running",), timeout=60).attempts.filter(resume="reattached").exists(), timeout=30, message="re-attached")
    job_service.finish(job["id"])
    ti = settle(run, "export", ("success", "failed"), timeout=60)
    assert ti.state == "success"
    assert _resumes(ti) == ["submitted", "reattached"]
    assert job_service.events("cancel") == []
    assert len(job_service.new_submits()) == 1
    assert_invariants([run], remote_jobs=job_service.ledger(), operator_actions=True)


def test_an_execution_timeout_cancels_the_job(worker, make_dag, job_service):
    dag = make_dag([_export(job_service, seconds=60)], retries=0, execution_timeout=3)
    run = trigger(dag)
    worker()
    ti = settle(run, "export", ("success", "failed"), timeout=60)
    assert attempts_of(ti) == [("user", "failed", "execution_timeout", 1, 0)]
    (cancel,) = job_service.events("cancel")
    assert cancel["was"] == "running"
    assert "cancelling remote job" in ti.attempts.get().stderr
    assert cancel["id"] == job_service.new_submits()[0]["id"]
    assert_invariants([run], remote_jobs=job_service.ledger(), operator_actions=True)


def test_mark_failed_cancels_the_job(worker, make_dag, job_service, admin_user):
    dag = make_dag([_export(job_service, seconds=60)], retries=0)
    run = trigger(dag)
    worker()
    _submitted(job_service)
    wait_until(lambda: instance(run, "export").attempts.filter(resume="submitted").exists(), timeout=10, message="decision recorded")
    actions.mark_failed(instance(run, "export"), admin_user, note="wrong day")
    (cancel,) = wait_until(lambda: job_service.events("cancel"), timeout=20, message="the job cancelled")
    assert cancel["was"] == "running"
    assert_invariants([run], remote_jobs=job_service.ledger(), operator_actions=True)


def test_a_failed_job_is_resubmitted_on_the_next_user_try(worker, make_dag, job_service):
    dag = make_dag([_export(job_service, seconds=1, fail_times=1)], retries=1)
    run = trigger(dag)
    worker()
    ti = settle(run, "export", ("success", "failed"), timeout=60)
    assert ti.state == "success"
    assert attempts_of(ti) == [("user", "failed", "task_exception", 1, 0), ("user", "success", None, 2, 0)]
    assert _resumes(ti) == ["submitted", "resubmitted"]
    assert len(job_service.new_submits()) == 2
    assert job_service.events("cancel") == []
    assert_invariants([run], remote_jobs=job_service.ledger(), operator_actions=True)


def test_a_retry_after_the_job_succeeded_returns_its_result_without_submitting(worker, make_dag, job_service, admin_user):
    """Cleared with keep_task_state, the task finds its job succeeded: already_succeeded, no
    submit; cleared without, it submits a new job under a new key."""
    dag = make_dag([_export(job_service, seconds=1)], retries=0)
    run = trigger(dag)
    worker()
    settle(run, "export", ("success",), timeout=60)
    actions.clear(instance(run, "export"), admin_user, keep_task_state=True)
    ti = settle(run, "export", ("success",), timeout=60)
    assert _resumes(ti) == ["submitted", "already_succeeded"]
    assert len(job_service.new_submits()) == 1
    actions.clear(instance(run, "export"), admin_user)
    ti = settle(run, "export", ("success",), timeout=60)
    assert _resumes(ti) == ["submitted", "already_succeeded", "submitted"]
    first, second = job_service.new_submits()
    assert first["key"] != second["key"]
    assert remote_job_violations(job_service.ledger()) == []  # each clear gave a new key


def test_a_backfill_rerun_empties_the_task_state_and_the_job_is_computed_anew(worker, make_dag, job_service):
    """A backfill re-running a finished run clears its tasks as an operator does: the task state
    is emptied, so the task submits a new job under a new key instead of answering
    already_succeeded from its old one."""
    from django.utils import timezone

    from orchestrator.engine import backfill_runs as engine
    from orchestrator.models import AuditLog, Dag, DagRun, TaskStateEntry
    from orchestrator.operations import backfills

    dag = make_dag([_export(job_service, seconds=1)], retries=0)
    Dag.objects.filter(pk=dag.pk).update(schedule="@daily", timezone="UTC")
    dag.refresh_from_db()
    request = backfills.check(dag, start="2026-03-27", end="2026-03-27", reprocess="completed")
    worker()
    first = backfills.create(backfills.check(dag, start="2026-03-27", end="2026-03-27"), None, created_by="cli")
    engine.start_batch(first.pk, timezone.now())
    run = DagRun.objects.get(dag=dag)
    settle(run, "export", ("success",), timeout=60)
    assert TaskStateEntry.objects.filter(task_instance__dag_run=run).exists()

    again = backfills.create(request, None, created_by="carol")
    assert engine.start_batch(again.pk, timezone.now()) == 1
    ti = settle(run, "export", ("success",), timeout=60)
    assert _resumes(ti) == ["submitted", "submitted"]
    first_job, second_job = job_service.new_submits()
    assert first_job["key"] != second_job["key"]
    assert AuditLog.objects.filter(action="clear", run_id=run.run_id, task_id="export", username="carol").count() == 1
