"""The spool: each worker its own directory (no worker delivers, or lets go of, another's
reports), an ended worker's reports adopted, and a report no database takes set aside with its
reason (counted, shown on the workers page) without holding up the ones behind it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.db import OperationalError

from orchestrator.data import metrics
from orchestrator.engine import reporting
from orchestrator.engine.reporting import WorkerInfo
from orchestrator.models import TaskInstance
from orchestrator.worker.host.spool import REPEATED_DELIVERIES, Retry, Spool, Streaks, seal, set_aside_entries
from tests.conftest import wait_until
from tests.worker.conftest import instance, settle, trigger

T = "tests.worker.tasks."


def record(ti_id: int, token: int, **extra) -> dict:
    return {"task_instance_id": ti_id, "token": token, "success": True, "ended_at": "2026-01-01T00:00:00+00:00",
            "output": {"stdout": "", "stderr": "", "output_truncated": False}, "result": None, **extra}  # fmt: skip


def test_each_worker_drains_only_its_own_directory(tmp_path):
    one, two = Spool(tmp_path, "host.1"), Spool(tmp_path, "host.2")
    one.put(record(1, 1))
    two.put(record(2, 1))
    seen: list[int] = []
    one.drain(lambda r: seen.append(r["task_instance_id"]) or True)
    assert seen == [1]
    assert [p.name for p in (tmp_path / "host.2").glob("ti-*.json")] == ["ti-2-1.json"]
    with pytest.raises(RuntimeError):
        Spool(tmp_path, "host.2")  # a live worker's directory is its own
    one.close()
    two.close()


def test_an_ended_workers_reports_are_adopted(tmp_path):
    ended = Spool(tmp_path, "host.1")
    ended.put(record(1, 1))
    ended.close()  # the process ended: its lock is gone
    (tmp_path / "ti-9-1.json").write_text(seal(json.dumps(record(9, 1))))  # the older, flat layout
    live = Spool(tmp_path, "host.2")
    seen: list[int] = []
    live.drain(lambda r: seen.append(r["task_instance_id"]) or True)
    assert sorted(seen) == [1, 9]
    assert not (tmp_path / "host.1").exists()
    live.close()


@pytest.mark.django_db
def test_a_refused_report_is_set_aside_and_the_rest_delivered(tmp_path):
    spool = Spool(tmp_path, "host.1")
    first = spool.put(record(1, 1))
    spool.put(record(2, 1))
    (spool.directory / "ti-3-1.json").write_text("{not json")
    first.touch()  # oldest first: the refused one is in front

    def deliver(r: dict) -> bool:
        if r["task_instance_id"] == 1:
            raise ValueError("refused for a reason of its own")
        return True

    refused = dict((labels["worker_name"], n) for labels, n in metrics.read(metrics.SPOOL_FILES_REFUSED)).get("host.1", 0)
    assert spool.drain(deliver) == 1
    aside = tmp_path / "set-aside"
    assert sorted(p.name for p in aside.glob("ti-*.json")) == ["ti-1-1.json", "ti-3-1.json"]
    assert "ValueError: refused for a reason of its own" in (aside / "ti-1-1.json.reason").read_text()
    assert not list(spool.directory.glob("ti-*.json"))
    reasons = {entry["task_instance_id"]: entry["reason"] for entry in set_aside_entries()}
    assert reasons[1].startswith("ValueError")
    assert dict((labels["worker_name"], n) for labels, n in metrics.read(metrics.SPOOL_SET_ASIDE)) == {"host.1": 1}
    # The file that is no JSON was not made by a worker: refused, and counted as such.
    assert "not made by this platform" in (aside / "ti-3-1.json.reason").read_text()
    assert dict((labels["worker_name"], n) for labels, n in metrics.read(metrics.SPOOL_FILES_REFUSED)).get("host.1") == refused + 1
    spool.close()


@pytest.mark.django_db
def test_the_database_being_away_stops_the_drain_and_keeps_every_file(tmp_path):
    spool = Spool(tmp_path, "host.1")
    spool.put(record(1, 1))
    spool.put(record(2, 1))

    def away(r: dict) -> bool:
        raise OperationalError("connection refused")

    assert spool.drain(away) == 0
    assert len(list(spool.directory.glob("ti-*.json"))) == 2
    assert not (tmp_path / "set-aside").exists()
    spool.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.integration
def test_a_report_told_to_wait_keeps_its_file_and_the_ones_behind_it_are_delivered(tmp_path):
    spool = Spool(tmp_path, "host.1")
    first, second = spool.put(record(1, 1)), spool.put(record(2, 1))

    def deliver(report: dict) -> bool:
        if report["task_instance_id"] == 1:
            raise Retry("OperationalError: canceling statement due to statement timeout")
        return True

    assert spool.drain(deliver) == 1
    assert first.exists()
    assert not second.exists()
    assert not (tmp_path / "set-aside").exists()
    spool.close()


def test_an_error_counts_as_repeated_after_the_tolerance_and_enough_deliveries():
    streaks, attempt = Streaks(), (1, 1)
    timeout = "OperationalError 57014"
    # Within the tolerance: waits, however many deliveries failed.
    assert not any(streaks.failed(attempt, timeout, tolerance=10, now=float(t)) for t in range(10))
    assert streaks.failed(attempt, timeout, tolerance=10, now=10.0)
    # Another error starts its own streak; so does a cleared one.
    assert not streaks.failed(attempt, "OperationalError 40P01", tolerance=10, now=30.0)
    streaks.clear(attempt)
    assert not streaks.failed(attempt, timeout, tolerance=10, now=50.0)
    # One failure long ago and one now are no repetition: REPEATED_DELIVERIES at least.
    assert REPEATED_DELIVERIES == 3
    assert not streaks.failed(attempt, timeout, tolerance=10, now=100.0)
    assert streaks.failed(attempt, timeout, tolerance=10, now=101.0)
    assert not streaks.failed((2, 1), timeout, tolerance=0, now=101.0)  # each report its own


def test_a_worker_sets_aside_what_the_database_refuses_and_delivers_the_rest(worker, make_dag, tmp_path, admin_client):
    """A real worker adopts an ended worker's spool: the report the database refuses is set
    aside (with its reason, counted, on the workers page), the one behind it is delivered."""
    dag = make_dag([{"task_id": "a", "bash_command": "true"}, {"task_id": "b", "bash_command": "true"}])
    run = trigger(dag)
    holder = WorkerInfo(hostname="gone", worker_name="gone.1", pid=1)
    for task_id in ("a", "b"):
        ti = settle(run, task_id, ("queued",))
        assert reporting.claim(ti.pk, ti.attempt_token, holder)
        assert reporting.mark_running(ti.pk, ti.attempt_token)
    a, b = instance(run, "a"), instance(run, "b")
    ended = tmp_path / "spool" / "gone.1"
    ended.mkdir(parents=True)
    # Not a state the engine knows: no database could take this report, nor its bare failure.
    bad = {**record(a.pk, a.attempt_token), "success": False, "expected": ["no-such-state"],
           "context": {"category": "application", "reason": "task_exception", "source": "worker", "metadata": {}}}  # fmt: skip
    (ended / f"ti-{a.pk}-{a.attempt_token}.json").write_text(seal(json.dumps(bad)))
    (ended / f"ti-{b.pk}-{b.attempt_token}.json").write_text(seal(json.dumps(record(b.pk, b.attempt_token, result="done"))))
    worker(ORCHESTRATOR_SPOOL_DIR=str(tmp_path / "spool"))
    wait_until(lambda: TaskInstance.objects.get(pk=b.pk).state == "success", timeout=30, message="b's report delivered")
    aside = tmp_path / "spool" / "set-aside" / f"ti-{a.pk}-{a.attempt_token}.json"
    wait_until(aside.exists, timeout=10, message="a's report set aside")
    assert "no-such-state" in Path(str(aside) + ".reason").read_text()
    page = admin_client.get("/workers/").content.decode()
    assert 'id="set-aside"' in page
    assert f"{a.pk} (attempt {a.attempt_token})" in page
    assert "no-such-state" in page
    assert page.count('id="set-aside"') == 1
    assert "<title>Workers and queues" in page


@pytest.fixture
def admin_client(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("admin", "admin@example.com", password=None))
    return client
