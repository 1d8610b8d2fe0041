"""The database away and the spool unusable (a full disk here): the outcome can be neither
delivered nor kept. The worker must not hold the attempt's lease for ever (the task would stay
`running` with nobody to end it): it lets the lease go, says so loudly (log, counter, workers
page), and the scheduler retries the task as the platform's failure, saying why."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from django.db import connection

from orchestrator.data import metrics
from orchestrator.engine.scheduler import schedule_once
from orchestrator.models import TaskAttempt
from tests.conftest import wait_until
from tests.worker.conftest import running_pid, settle, trigger
from tests.worker.proxy import TcpProxy
from tests.worker.test_supervisor import _database_url, _through

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

T = "tests.worker.tasks."


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs of the test's own, unmounted afterwards."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small disk needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "orchestrator-test", str(disk)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _fill(disk) -> None:
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_an_outcome_neither_delivered_nor_spooled_ends_its_lease_and_is_retried_as_the_platforms(
    worker, make_dag, scheduler_settings, tmp_path, small_disk, admin_client
):
    if connection.vendor != "postgresql":
        pytest.skip("cuts the worker off from the database with a TCP proxy: PostgreSQL only")
    db = connection.settings_dict
    proxy = TcpProxy(db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432))
    spool = small_disk / "spool"
    dag = make_dag([{"task_id": "t", "python_callable": T + "window", "op_kwargs": {"path": str(tmp_path / "w"), "seconds": 2}}])
    proc = worker(
        DATABASE_URL=_through(proxy, _database_url()),
        ORCHESTRATOR_HEARTBEAT_TIMEOUT=scheduler_settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT,
        ORCHESTRATOR_REPORT_PATIENCE=1,
        ORCHESTRATOR_SPOOL_DIR=str(spool),
    )
    before = sum(count for _, count in metrics.read(metrics.SPOOL_UNWRITABLE))
    try:
        run = trigger(dag)
        running_pid(run, "t")
        _fill(small_disk)
        proxy.cut()
        said = lambda: "".join(proc.log_lines)  # type: ignore[attr-defined]  # noqa: E731
        wait_until(lambda: "its outcome is lost" in said(), timeout=30, message="the worker to say the outcome is lost")
        proxy.restore()
        def first_attempt_ended():
            schedule_once()
            attempt = TaskAttempt.objects.filter(task_instance__dag_run=run).order_by("id").first()
            return attempt if attempt is not None and attempt.context else None

        first = wait_until(first_attempt_ended, timeout=30, message="the lost attempt to be presumed lost")
        ti = settle(run, "t", ("success",), timeout=30)  # its platform retry ran it again
        assert first.context["category"] == "infrastructure", first.context
        assert first.context["reason"] == "worker_lost", first.context
        assert "spool cannot keep outcomes" in first.context["metadata"]["outcome_lost"]
        assert (ti.try_number, ti.infrastructure_try_number) == (1, 1)  # the platform paid, not the user
        page = admin_client.get("/workers/").content.decode()
        assert "spool unusable" in page
        assert sum(count for _, count in metrics.read(metrics.SPOOL_UNWRITABLE)) == before + 1
    finally:
        proxy.cut()
