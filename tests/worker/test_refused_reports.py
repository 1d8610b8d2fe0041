"""Reports the database refuses for a reason other than a lost connection, through a real worker:
a trigger installed by the test on the attempts table refuses one attempt's write (PostgreSQL:
`RAISE EXCEPTION ... USING ERRCODE = '22000'`, a DataError; SQLite: `RAISE(ABORT)`, an
IntegrityError). Whatever it refuses, the attempt ends as a classified failure, or its report is
set aside and its lease let go; nothing is left `running` or `queued`, the run moves on, and the
worker's slot keeps taking work."""
from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from orchestrator.data import metrics
from orchestrator.engine import reporting
from orchestrator.engine.reporting import WorkerInfo
from orchestrator.models import TaskAttempt, TaskInstance, TaskStateEntry
from orchestrator.worker.host.spool import seal
from tests.conftest import wait_until
from tests.worker.conftest import instance, settle, trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

T = "tests.worker.tasks."
REFUSAL = "refused by the test"


@pytest.fixture
def refuse() -> Iterator[Callable[[str], Callable[[], None]]]:
    """`refuse(when)`: the database refuses every UPDATE of an attempt row (or `event` of a row
    of `table`) for which `when` (SQL over OLD and NEW, the same in both databases) holds;
    returns what removes it again. PostgreSQL only: `body` (plpgsql) instead of the refusal."""
    removers: list[Callable[[], None]] = []

    def install(when: str, table: str = "orchestrator_taskattempt", event: str = "UPDATE", body: str = "") -> Callable[[], None]:
        name = f"refuse_{uuid.uuid4().hex[:10]}"
        body = body or f"RAISE EXCEPTION '{REFUSAL}' USING ERRCODE = '22000';"
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {body} END $$")
                cursor.execute(
                    f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION {name}()"
                )
            else:
                cursor.execute(
                    f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW WHEN {when} "
                    f"BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END"
                )

        def remove() -> None:
            with connection.cursor() as cursor:
                if connection.vendor == "postgresql":
                    cursor.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
                    cursor.execute(f"DROP FUNCTION IF EXISTS {name}()")
                else:
                    cursor.execute(f"DROP TRIGGER IF EXISTS {name}")

        removers.append(remove)
        return remove

    yield install
    for remove in removers:  # a trigger outlives the test's flush of the tables
        remove()


def nothing_left_active() -> None:
    assert not TaskInstance.objects.filter(state__in=["queued", "running"]).exists()
    assert not TaskAttempt.objects.filter(state__in=["queued", "running"]).exists()


def set_aside_count() -> int:
    return sum(n for _, n in metrics.read(metrics.SPOOL_SET_ASIDE))



def set_aside(spool: Path, pk: int, token: int, counted: int, *, why: str, timeout: float) -> Path:
    """Wait for the report of attempt (pk, token) to be set aside in `spool`, saying `why`, and
    counted once more than `counted`; its path."""
    aside = spool / "set-aside" / f"ti-{pk}-{token}.json"
    wait_until(aside.exists, timeout=timeout, message=f"the report of {pk}-{token} set aside")
    assert why in Path(f"{aside}.reason").read_text()
    wait_until(lambda: set_aside_count() == counted + 1, timeout=5, message="the set-aside report counted")
    return aside

def test_a_success_the_database_refuses_ends_as_the_classified_failure_and_the_run_moves_on(worker, make_dag, refuse):
    """The success is refused: the same attempt ends as application/task_exception
    (UnstorableOutcome, `report_refused` saying why), charged to the user; its lease goes with
    it, the downstream task runs, and the worker's one slot takes the next task."""
    dag = make_dag(
        [
            {"task_id": "a", "python_callable": T + "succeed"},
            {"task_id": "after", "bash_command": "echo after", "upstream": ["a"], "trigger_rule": "all_done"},
        ],
        retries=0,
    )
    run = trigger(dag)
    refuse(f"OLD.task_instance_id = {instance(run, 'a').pk} AND NEW.state = 'success'")
    proc = worker(ORCHESTRATOR_WORKER_CONCURRENCY="1")
    a = settle(run, "a", ("failed",), timeout=40)
    attempt = a.attempts.get()
    assert (attempt.state, attempt.kind) == ("failed", "user")
    context = attempt.context
    assert (context["category"], context["reason"], context["source"]) == ("application", "task_exception", "worker")
    assert context["metadata"]["exception_type"] == "UnstorableOutcome"
    assert REFUSAL in context["metadata"]["report_refused"]
    assert context["metadata"]["output_dropped"] is True
    assert a.heartbeat_at is None
    assert a.result is None
    # The run moves on: its downstream task runs in the same (only) slot.
    after = settle(run, "after", ("success",), timeout=30)
    assert after.attempts.get().result == "after"
    run.refresh_from_db()
    assert run.state == "failed"
    nothing_left_active()
    assert proc.poll() is None


def test_a_success_refused_and_its_failure_too_is_set_aside_and_the_task_runs_again(worker, make_dag, refuse, tmp_path):
    """Every write of the attempt refused: the report is set aside (with why, counted), the lease
    let go; once the database takes writes again the scheduler finds the attempt lost and the
    retry (on the platform budget) succeeds at try 1."""
    dag = make_dag([{"task_id": "a", "python_callable": T + "succeed"}], retries=0)
    run = trigger(dag)
    pk = instance(run, "a").pk
    allow = refuse(f"OLD.task_instance_id = {pk} AND OLD.infrastructure_try_number = 0 AND NEW.state IN ('success', 'failed')")
    spool, counted = tmp_path / "spool", set_aside_count()
    proc = worker(ORCHESTRATOR_SPOOL_DIR=str(spool))
    first = settle(run, "a", ("running",), timeout=30)
    # No scheduler pass meanwhile: its finding the attempt lost would be refused just the same.
    aside = set_aside(spool, pk, first.attempt_token, counted, why=REFUSAL, timeout=30)
    assert json.loads(aside.read_text())["context"]["metadata"]["exception_type"] == "UnstorableOutcome"
    allow()
    a = settle(run, "a", ("success",), timeout=40)
    lost, retried = a.attempts.order_by("attempt_token")
    assert (lost.kind, lost.context["reason"]) == ("platform", "worker_lost")
    assert (retried.state, a.try_number) == ("success", 1)
    nothing_left_active()
    assert proc.poll() is None


def test_a_handshake_the_database_refuses_is_a_start_error_and_the_slot_carries_on(worker, make_dag, refuse):
    """"running" refused for a Python task (stopped before "go") and for a bash command started
    directly (never started): infrastructure/pre_execution_failure (start_error) on the platform
    budget, then application/startup_error on the user's; neither is left `queued`, and the
    worker's one slot runs the next task."""
    dag = make_dag(
        [
            {"task_id": "py", "python_callable": T + "succeed"},
            {"task_id": "sh", "bash_command": "echo never"},
            {"task_id": "after", "bash_command": "echo after", "upstream": ["py", "sh"], "trigger_rule": "all_done"},
        ],
        retries=0,
    )
    run = trigger(dag)
    refused = [instance(run, "py").pk, instance(run, "sh").pk]
    refuse(f"OLD.task_instance_id IN ({', '.join(map(str, refused))}) AND NEW.state = 'running'")
    proc = worker(ORCHESTRATOR_WORKER_CONCURRENCY="1")
    for task_id in ("py", "sh"):
        ti = settle(run, task_id, ("failed",), timeout=40)
        platform, user = ti.attempts.order_by("attempt_token")
        assert (platform.kind, platform.context["category"], platform.context["reason"]) == ("platform", "infrastructure", "pre_execution_failure"), task_id
        metadata = platform.context["metadata"]
        assert metadata["pre_execution_reason"] == "start_error", metadata
        assert REFUSAL in metadata["handshake_refused"], metadata
        assert platform.start_date is None
        assert not platform.stdout
        assert (user.kind, user.context["category"], user.context["reason"]) == ("user", "application", "startup_error"), task_id
        assert ti.try_number == 1
    assert settle(run, "after", ("success",), timeout=30).attempts.get().result == "after"
    nothing_left_active()
    assert proc.poll() is None


def test_a_handshake_refused_with_its_failure_too_is_set_aside_and_the_task_runs_again(worker, make_dag, refuse, tmp_path):
    """Every write of the claimed attempt refused (its "running" and its failure): the report is
    set aside, the lease let go, the task process never told "go"; once the database takes
    writes again the scheduler finds the claim gone stale and the retry succeeds at try 1."""
    dag = make_dag([{"task_id": "a", "python_callable": T + "succeed"}], retries=0)
    run = trigger(dag)
    pk = instance(run, "a").pk
    allow = refuse(f"OLD.task_instance_id = {pk} AND OLD.infrastructure_try_number = 0 AND OLD.worker_name <> ''")
    spool, counted = tmp_path / "spool", set_aside_count()
    proc = worker(ORCHESTRATOR_SPOOL_DIR=str(spool))
    first = settle(run, "a", ("queued",), timeout=30)
    aside = set_aside(spool, pk, first.attempt_token, counted, why=REFUSAL, timeout=30)
    kept = json.loads(aside.read_text())["context"]
    assert (kept["reason"], kept["metadata"]["pre_execution_reason"]) == ("pre_execution_failure", "start_error")
    assert instance(run, "a").state == "queued"  # nothing of it was recorded
    allow()
    a = settle(run, "a", ("success",), timeout=40)
    lost, retried = a.attempts.order_by("attempt_token")
    assert (lost.kind, lost.context["reason"], lost.context["source"]) == ("platform", "pre_execution_failure", "scheduler")
    assert lost.start_date is None
    assert (retried.state, a.try_number) == ("success", 1)
    nothing_left_active()
    assert proc.poll() is None


def test_a_spooled_report_the_database_refuses_is_set_aside_and_the_ones_behind_it_delivered(worker, make_dag, refuse, tmp_path):
    """An ended worker's spool, adopted by a real worker: the oldest report's attempt refuses every
    write (its success, then its bare failure), so it is set aside (with why, counted) and its
    lease let go; the report behind it is delivered."""
    dag = make_dag([{"task_id": "a", "bash_command": "true"}, {"task_id": "b", "bash_command": "true"}])
    run = trigger(dag)
    holder = WorkerInfo(hostname="gone", worker_name="gone.1", pid=1)
    for task_id in ("a", "b"):
        ti = settle(run, task_id, ("queued",))
        assert reporting.claim(ti.pk, ti.attempt_token, holder)
        assert reporting.mark_running(ti.pk, ti.attempt_token)
    a, b = instance(run, "a"), instance(run, "b")
    refuse(f"OLD.task_instance_id = {a.pk} AND OLD.attempt_token = {a.attempt_token}")
    ended = tmp_path / "spool" / "gone.1"
    ended.mkdir(parents=True)
    for ti, age in ((a, 2), (b, 1)):  # oldest first: the refused one is in front
        path = ended / f"ti-{ti.pk}-{ti.attempt_token}.json"
        report = {"task_instance_id": ti.pk, "token": ti.attempt_token, "success": True, "result": ti.task_id,
                  "ended_at": "2026-01-01T00:00:00+00:00", "output": {"stdout": "", "stderr": "", "output_truncated": False}}  # fmt: skip
        path.write_text(seal(json.dumps(report)))  # sealed as a worker seals it
        os.utime(path, (time.time() - age, time.time() - age))
    counted = set_aside_count()
    worker(ORCHESTRATOR_SPOOL_DIR=str(tmp_path / "spool"))
    wait_until(lambda: TaskInstance.objects.get(pk=b.pk).state == "success", timeout=30, message="b's report delivered")
    assert TaskInstance.objects.get(pk=b.pk).result == "b"
    set_aside(tmp_path / "spool", a.pk, a.attempt_token, counted, why=REFUSAL, timeout=10)
    assert TaskInstance.objects.get(pk=a.pk).state == "running"  # nothing of it recorded: the scheduler's to find lost


def test_a_claim_the_database_refuses_fails_the_job_and_the_scheduler_retries_it_at_once(worker, make_dag, refuse):
    """The claim refused (not for want of a connection): nothing started, the RQ job failed; the
    next scheduler pass finds it (pre_execution_failure, platform budget) and the retry runs."""
    dag = make_dag([{"task_id": "a", "python_callable": T + "succeed"}], retries=0)
    run = trigger(dag)
    refuse(f"OLD.task_instance_id = {instance(run, 'a').pk} AND OLD.infrastructure_try_number = 0 AND NEW.worker_name <> ''")
    proc = worker(ORCHESTRATOR_WORKER_CONCURRENCY="1")
    a = settle(run, "a", ("success",), timeout=40)
    refused, retried = a.attempts.order_by("attempt_token")
    assert (refused.kind, refused.context["reason"], refused.context["source"]) == ("platform", "pre_execution_failure", "scheduler")
    assert refused.context["metadata"]["job_status"] == "failed"
    assert refused.worker_name == ""
    assert (retried.state, a.try_number) == ("success", 1)
    nothing_left_active()
    assert proc.poll() is None


def test_a_heartbeat_the_database_refuses_is_an_outage_bounded_by_its_tolerance(worker, make_dag, refuse):
    """The running task's heartbeat refused (not for want of a connection): the lease is kept in
    Redis as through an outage, for ORCHESTRATOR_DB_OUTAGE_TOLERANCE (1 s here), then no longer;
    the task is killed before the scheduler presumes it lost (worker_lost, platform), and the
    retry succeeds at try 1. Nothing is held for ever."""
    dag = make_dag([{"task_id": "a", "python_callable": T + "sleep_unless_retried", "op_kwargs": {"seconds": 60}}], retries=0)
    run = trigger(dag)
    # Only a heartbeat moves a running task and leaves it running with the same pid.
    refuse(f"OLD.id = {instance(run, 'a').pk} AND OLD.state = 'running' AND NEW.state = 'running' AND NEW.pid = OLD.pid", table="orchestrator_taskinstance")
    proc = worker(ORCHESTRATOR_DB_OUTAGE_TOLERANCE="1")
    started = time.monotonic()
    a = settle(run, "a", ("success",), timeout=60)
    lost, retried = a.attempts.order_by("attempt_token")
    assert (lost.kind, lost.context["reason"]) == ("platform", "worker_lost")
    assert (retried.state, a.try_number) == ("success", 1)
    assert time.monotonic() - started < 40  # the 60 s task did not run to its end
    nothing_left_active()
    assert proc.poll() is None


def test_a_task_state_change_the_database_refuses_is_a_value_error_in_the_task(worker, make_dag, refuse):
    """The task hears it as for any value it may not store (ValueError), nothing changed, and
    its next change is stored; the attempt goes on to its end."""
    dag = make_dag([{"task_id": "a", "python_callable": T + "set_refused_then_ok"}], retries=0)
    run = trigger(dag)
    refuse("NEW.key = 'refused'", table="orchestrator_taskstateentry", event="INSERT")
    worker()
    a = settle(run, "a", ("success",), timeout=40)
    assert a.result.startswith("the database refused it:"), a.result
    assert REFUSAL in a.result, a.result
    assert dict(TaskStateEntry.objects.filter(task_instance=a).values_list("key", "value")) == {"ok": 2}
    nothing_left_active()


def test_a_heartbeat_one_row_refuses_stops_only_that_task(worker, make_dag, refuse):
    """Three tasks on one worker; the database refuses the heartbeat of one of them (its row
    only). The heartbeat finds that row: the other two keep their leases past the outage
    tolerance and succeed at their first try; the refused one is kept for the tolerance (1 s
    here), then killed before the scheduler presumes it lost (worker_lost, platform), and its
    retry succeeds at try 1."""
    dag = make_dag(
        [
            {"task_id": "a", "python_callable": T + "sleep_unless_retried", "op_kwargs": {"seconds": 14}},
            {"task_id": "b", "python_callable": T + "sleep_unless_retried", "op_kwargs": {"seconds": 60}},
            {"task_id": "c", "python_callable": T + "sleep_unless_retried", "op_kwargs": {"seconds": 14}},
        ],
        retries=0,
    )
    run = trigger(dag)
    refuse(f"OLD.id = {instance(run, 'b').pk} AND OLD.state = 'running' AND NEW.state = 'running' AND NEW.pid = OLD.pid", table="orchestrator_taskinstance")
    proc = worker(ORCHESTRATOR_DB_OUTAGE_TOLERANCE="1", ORCHESTRATOR_WORKER_CONCURRENCY="3")
    started = time.monotonic()
    b = settle(run, "b", ("success",), timeout=60)
    lost, retried = b.attempts.order_by("attempt_token")
    assert (lost.kind, lost.context["category"], lost.context["reason"]) == ("platform", "infrastructure", "worker_lost")
    assert (retried.state, b.try_number) == ("success", 1)
    assert time.monotonic() - started < 40  # the 60 s task did not run to its end
    for task_id in ("a", "c"):
        ti = settle(run, task_id, ("success",), timeout=40)
        attempt = ti.attempts.get()  # never stopped, never retried
        assert (attempt.state, attempt.result, ti.try_number, ti.infrastructure_try_number) == ("success", "done", 1, 0), task_id
    nothing_left_active()
    assert proc.poll() is None


def test_a_spooled_report_that_times_out_every_time_is_set_aside_and_its_lease_let_go(worker, make_dag, refuse, tmp_path):
    """Every write of the attempt's outcome outlasts the worker's statement timeout (a trigger
    sleeps): not a lost connection, and not passing. The report is spooled, retried for
    ORCHESTRATOR_SPOOL_REPEATED_ERROR_TOLERANCE (2 s here), then taken as refused: its bare
    failure times out too, so it is set aside (with why) and its lease let go; once the writes
    are fast again the scheduler finds the attempt lost and the retry succeeds at try 1."""
    if connection.vendor != "postgresql":
        pytest.skip("a statement timeout is PostgreSQL's")
    dag = make_dag([{"task_id": "a", "python_callable": T + "succeed"}], retries=0)
    run = trigger(dag)
    pk = instance(run, "a").pk
    when = f"OLD.task_instance_id = {pk} AND OLD.infrastructure_try_number = 0 AND NEW.state IN ('success', 'failed')"
    allow = refuse(when, body="PERFORM pg_sleep(2); RETURN NEW;")
    spool, counted = tmp_path / "spool", set_aside_count()
    proc = worker(
        ORCHESTRATOR_SPOOL_DIR=str(spool),
        ORCHESTRATOR_WORKER_STATEMENT_TIMEOUT="0.3",
        ORCHESTRATOR_REPORT_PATIENCE="1",
        ORCHESTRATOR_SPOOL_REPEATED_ERROR_TOLERANCE="2",
    )
    first = settle(run, "a", ("running",), timeout=30)
    # No scheduler pass meanwhile: the worker alone must end it.
    aside = set_aside(spool, pk, first.attempt_token, counted, why="statement timeout", timeout=40)
    assert json.loads(aside.read_text())["success"] is True  # the report as spooled, for whoever looks
    assert not list((spool / proc_spool_name(spool)).glob("ti-*.json"))  # nothing left waiting
    allow()
    a = settle(run, "a", ("success",), timeout=40)
    lost, retried = a.attempts.order_by("attempt_token")
    assert (lost.kind, lost.context["reason"]) == ("platform", "worker_lost")
    assert (retried.state, a.try_number) == ("success", 1)
    nothing_left_active()
    assert proc.poll() is None


def proc_spool_name(spool: Path) -> str:
    """The running worker's own spool directory (the only one but `set-aside`)."""
    (own,) = [path.name for path in spool.iterdir() if path.is_dir() and path.name != "set-aside"]
    return own


def test_the_heartbeat_finds_the_rows_that_refuse_it_among_many(refuse):
    """Three rows of forty refuse the heartbeat: one beat records every other one's, and keeps
    only those three as through an outage (leases in Redis); once their refusal has lasted the
    outage tolerance they are kept no longer, while the others' heartbeats go on."""
    from django.utils import timezone

    from orchestrator.engine import leases
    from orchestrator.foundation.redis_conn import get_redis
    from orchestrator.models import Dag, DagRun
    from orchestrator.worker.host.heartbeat import Heartbeats

    dag = Dag.objects.create(dag_id="wide")
    run = DagRun.objects.create(dag=dag, run_id="r", logical_date=timezone.now(), queued_at=timezone.now())
    TaskInstance.objects.bulk_create(TaskInstance(dag_run=run, task_id=f"t{i}", state="running", attempt_token=1) for i in range(40))
    ids = sorted(TaskInstance.objects.values_list("id", flat=True))
    bad = {ids[3], ids[17], ids[38]}
    refuse(f"OLD.id IN ({', '.join(map(str, bad))}) AND NEW.heartbeat_at IS NOT NULL", table="orchestrator_taskinstance")
    heartbeats = Heartbeats(interval=0.2, timeout=30, outage_tolerance=0.5, holder="test", db_wait=10)
    watched = {pk: heartbeats.watch(pk, 1) for pk in ids}
    try:
        heartbeats.beat()
        assert heartbeats.database_lost_at is None  # the database answered: no outage
        assert {pk for pk, lease in watched.items() if lease.db_refused_at is not None} == bad
        assert set(TaskInstance.objects.filter(heartbeat_at__isnull=True).values_list("id", flat=True)) == bad
        assert leases.held(get_redis(), [(pk, 1) for pk in ids]) == {(pk, 1) for pk in bad}
        refused_since = {pk: watched[pk].lease_from for pk in bad}
        time.sleep(0.6)
        TaskInstance.objects.update(heartbeat_at=None)
        heartbeats.beat()  # past the tolerance: the refused ones' leases are no longer renewed
        assert {pk: watched[pk].lease_from for pk in bad} == refused_since
        assert set(TaskInstance.objects.filter(heartbeat_at__isnull=True).values_list("id", flat=True)) == bad
        assert not any(lease.refused for lease in watched.values())  # refused by the database, not superseded
    finally:
        heartbeats.stop()
        heartbeats._database.shutdown(wait=True)  # its thread's connection closed before the database is dropped
        get_redis().delete(*(leases.KEY.format(task_instance_id=pk, token=1) for pk in bad))
