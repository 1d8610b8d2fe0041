"""Two processes recording the same failure at the same moment open one incident, not two:
the database's unique open incident per rule and group decides, not a lock in memory."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from alerts.models import Delivery, Incident
from tests.alerts.helpers import rule, run_of
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 8

RECORDER = """
import os, sys, time
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
django.setup()
from alerts import incidents
from alerts.matching import Event, Rule
from alerts.models import AlertRule
from orchestrator.clock import shared_now

go, rounds, run_pk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rule = Rule.of(AlertRule.objects.get(name="race"))
for n in range(rounds):
    event = Event(kind="task_failed", at=shared_now(), dag_id=f"d{n}", run_id="r", dag_run_id=run_pk, category="application", reason="task_exception")
    while not os.path.exists(f"{go}.{n}"):
        time.sleep(0.001)
    incidents.record(rule, event)
    open(f"{go}.{n}.done.{os.getpid()}", "w").close()
"""


def test_two_processes_open_one_incident_per_group(process_env, tmp_path: Path):
    rule("race", group_by=["dag_id"])
    run = run_of("race")
    go = str(tmp_path / "go")
    procs = [
        subprocess.Popen([sys.executable, "-c", RECORDER, go, str(ROUNDS), str(run.pk)], env=process_env, cwd=ROOT)
        for _ in range(2)
    ]
    try:
        time.sleep(3)  # both set up and waiting
        for n in range(ROUNDS):
            Path(f"{go}.{n}").touch()  # both record round n at once
            deadline = time.monotonic() + 30
            while len(list(tmp_path.glob(f"go.{n}.done.*"))) < 2 and time.monotonic() < deadline:
                assert all(p.poll() in (None, 0) for p in procs), "a recorder failed"
                time.sleep(0.005)
        assert [p.wait(timeout=30) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    groups = sorted(Incident.objects.values_list("group__dag_id", "count"))
    assert groups == [(f"d{n}", 2) for n in range(ROUNDS)]
    assert Delivery.objects.filter(event="opened").count() == ROUNDS
