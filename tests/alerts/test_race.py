"""Two processes counting events of the same group at the same moment open one incident, not
two: the database's unique open incident per rule and group decides, not a lock in memory. Two
senders taking the same queued events count each once: an event is counted by whoever deletes
its row."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from alerts.matching import Event, Rule, group_key, group_of
from alerts.models import AlertEvent, AlertRule, Delivery, Incident
from orchestrator.foundation.clock import shared_now
from tests.alerts.helpers import rule, run_of
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 8

OPENER = """
import os, sys, time
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
django.setup()
from alerts import incidents
from alerts.matching import group_key
from alerts.models import AlertEvent, AlertRule
from orchestrator.foundation.clock import shared_now

go, rounds, run_pk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rule_id = AlertRule.objects.get(name="race").pk
open(f"{go}.ready.{os.getpid()}", "w").close()
for n in range(rounds):
    group = {"dag_id": f"d{n}"}
    event = AlertEvent(rule_id=rule_id, group_key=group_key(group), group=group, at=shared_now(), dag_run_id=run_pk,
                       sample={"dag_id": f"d{n}"})
    while not os.path.exists(f"{go}.{n}"):
        time.sleep(0.001)
    incidents.count_in_incident(rule_id, event.group_key, group, [event])
    open(f"{go}.{n}.done.{os.getpid()}", "w").close()
"""

ABSORBER = """
import os, sys, time
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
django.setup()
from alerts import incidents

go = sys.argv[1]
open(f"{go}.ready.{os.getpid()}", "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
taken = 0
while True:
    got = incidents.absorb(limit=int(sys.argv[2]))
    if not got and not incidents.AlertEvent.objects.exists():
        break
    taken += got
print(taken)
"""


def _await_ready(tmp_path: Path, procs: list[subprocess.Popen]) -> None:
    """Until both processes are set up and waiting for the go."""
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("go.ready.*"))) < len(procs):
        assert all(p.poll() is None for p in procs), "a process exited while setting up"
        assert time.monotonic() < deadline, "the processes did not get ready"
        time.sleep(0.01)


def _start(script: str, *args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *args], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)


def test_two_processes_open_one_incident_per_group(process_env, tmp_path: Path):
    rule("race", group_by=["dag_id"])
    run = run_of("race")
    go = str(tmp_path / "go")
    procs = [_start(OPENER, go, str(ROUNDS), str(run.pk), env=process_env) for _ in range(2)]
    try:
        _await_ready(tmp_path, procs)
        for n in range(ROUNDS):
            Path(f"{go}.{n}").touch()  # both count round n at once
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


def test_two_senders_count_each_queued_event_once(process_env, tmp_path: Path):
    made = rule("storm", group_by=["dag_id"])
    run = run_of("storm")
    matcher = Rule.of(AlertRule.objects.get(pk=made.pk))
    events = []
    for n in range(400):
        event = Event(kind="task_failed", at=shared_now(), dag_id=f"d{n % 4}", run_id="r", dag_run_id=run.pk, task_instance_id=n)
        group = group_of(matcher, event)
        events.append(AlertEvent(rule_id=made.pk, group_key=group_key(group), group=group, at=event.at, sample=event.sample(),
                                 dag_run_id=run.pk, task_instance_id=n))  # fmt: skip
    AlertEvent.objects.bulk_create(events)
    go = tmp_path / "go"
    procs = [_start(ABSORBER, str(go), "25", env=process_env) for _ in range(2)]
    try:
        _await_ready(tmp_path, procs)
        go.touch()
        outputs = [p.communicate(timeout=60)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    taken = [int(out.strip()) for out in outputs]
    assert sum(taken) == 400, taken
    assert sorted(Incident.objects.values_list("group__dag_id", "count")) == [(f"d{n}", 100) for n in range(4)]
    assert Delivery.objects.filter(event="opened").count() == 4
    assert not AlertEvent.objects.exists()
