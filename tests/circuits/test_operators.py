"""Operators and observers: the circuits API (audited, permission-checked), the metrics gauges, the hooks."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from orchestrator import listeners
from orchestrator.engine import circuits
from orchestrator.listeners import hookimpl
from orchestrator.models import AuditLog, Circuit
from tests.api.personas import alice, alice_client, fast_password_hasher  # noqa: F401

pytestmark = pytest.mark.django_db

EVENTS: list[tuple[str, str]] = []


@hookimpl
def on_circuit_opened(circuit):
    EVENTS.append(("opened", circuit.name))


@hookimpl
def on_circuit_closed(circuit):
    EVENTS.append(("closed", circuit.name))


def test_opening_needs_the_permission_and_is_audited(alice, alice_client):  # noqa: F811
    Circuit.objects.create(name="payments-api")
    assert alice_client.post("/api/v1/circuits/payments-api/open").status_code == 403
    alice.user_permissions.add(Permission.objects.get(codename="change_circuit"))
    alice_client.force_login(type(alice).objects.get(pk=alice.pk))
    response = alice_client.post("/api/v1/circuits/payments-api/open", {"note": "vendor incident"}, content_type="application/json")
    assert response.status_code == 200
    assert response.json()["state"] == "open"
    entry = AuditLog.objects.get(action="circuit_open")
    assert (entry.username, entry.prior_state, entry.new_state) == ("alice", "closed", "open")
    assert entry.details == {"circuit": "payments-api", "note": "vendor incident"}
    assert alice_client.post("/api/v1/circuits/payments-api/probe").json()["state"] == "half_open"
    assert alice_client.post("/api/v1/circuits/payments-api/close").json()["state"] == "closed"
    assert alice_client.post("/api/v1/circuits/nowhere/close").status_code == 404
    listed = alice_client.get("/api/v1/circuits").json()["circuits"]
    assert [(c["name"], c["state"], c["attempts"], c["failures"]) for c in listed] == [("payments-api", "closed", 0, 0)]


def test_the_gauge_follows_the_state_and_a_cool_down_reads_half_open(alice_client):  # noqa: F811
    Circuit.objects.create(name="open-one", state="open", opened_at=timezone.now())
    Circuit.objects.create(name="cooled", state="open", opened_at=timezone.now() - timedelta(hours=1))
    Circuit.objects.create(name="fine")
    body = alice_client.get("/metrics").content.decode()
    assert 'orchestrator_circuit_state{circuit="open-one"} 2.0' in body
    assert 'orchestrator_circuit_state{circuit="cooled"} 1.0' in body
    assert 'orchestrator_circuit_state{circuit="fine"} 0.0' in body


def test_the_hooks_hear_an_open_and_a_close(settings, django_capture_on_commit_callbacks):
    settings.ORCHESTRATOR_LISTENERS = [f"{__name__}"]
    EVENTS.clear()
    circuit = Circuit.objects.create(name="payments-api")
    now = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        assert circuits.open_circuit(circuit, now, reason="test")
        # Opening an open circuit restarts its cool-down; nobody is told twice.
        assert circuits.open_circuit(Circuit.objects.get(pk=circuit.pk), now, reason="again")
        assert circuits.close_circuit(Circuit.objects.get(pk=circuit.pk), now, reason="test")
    assert listeners.drain()
    assert EVENTS == [("opened", "payments-api"), ("closed", "payments-api")]
