"""Notifications to a real HTTP receiver on a loopback port: sent, retried with backoff after a
500 or no answer, each try recorded and counted; a receiver that hangs never delays a task."""
from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from alerts import incidents, sending
from alerts.models import Delivery, DeliveryTry, Incident
from orchestrator.data import metrics
from orchestrator.foundation.clock import shared_now
from tests.alerts.helpers import Receiver, fail, rule, run_of, succeed, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def loopback_allowed(settings) -> None:
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]


@pytest.fixture
def receiver(request) -> Iterator[Receiver]:
    """A receiver answering 200; parametrized indirectly with its first answers."""
    made = Receiver(list(getattr(request, "param", [])))
    yield made
    made.close()


def counted(rule_name: str, outcome: str) -> int:
    return sum(n for labels, n in metrics.read(metrics.ALERT_NOTIFICATIONS) if labels == {"rule": rule_name, "outcome": outcome})


def test_it_sends_the_payload_of_the_contract(receiver):
    rule("hook", notify="notifier:webhook", notify_kwargs={"url": receiver.url, "format": "slack"}, group_by=["dag_id"])
    before = counted("hook", "sent")
    run = run_of("etl")
    fail(run)
    assert sending.send_due() == 1
    (body,) = receiver.bodies
    assert set(body) == {"event", "rule", "group", "count", "first_event_at", "last_event_at", "sample", "url", "text"}
    assert body["event"] == "opened"
    assert body["rule"] == "hook"
    assert body["group"] == {"dag_id": "etl"}
    assert body["count"] == 1
    assert body["sample"] == {
        "dag_id": "etl", "run_id": run.run_id, "task_id": "t", "map_index": -1,
        "category": "application", "reason": "task_exception", "message": "KeyError: 'x'",
    }  # fmt: skip
    assert body["text"].startswith("[opened] hook: 1 event (dag_id=etl)")
    incident = Incident.objects.get()
    assert body["url"] == f"/alerts/?rule=hook#incident-{incident.pk}"  # no ORCHESTRATOR_BASE_URL: relative
    delivery = Delivery.objects.get()
    assert delivery.state == "sent"
    assert delivery.tries == 1
    assert counted("hook", "sent") == before + 1


def test_the_url_is_absolute_with_the_consoles_base_url(receiver, settings):
    settings.ORCHESTRATOR_BASE_URL = "https://orchestrator.example.com/console"
    rule("linked", notify="notifier:webhook", notify_kwargs={"url": receiver.url})
    fail(run_of("etl"))
    assert sending.send_due() == 1
    (body,) = receiver.bodies
    incident = Incident.objects.get()
    assert body["url"] == f"https://orchestrator.example.com/console/alerts/?rule=linked#incident-{incident.pk}"


@pytest.mark.parametrize("receiver", [[500], [404], [403], [302]], indirect=True)
def test_a_non_2xx_answer_is_tried_again_after_a_second_then_sent(receiver):
    status = receiver.answers[0]  # read before the receiver answers it
    rule("flaky", notify="notifier:webhook", notify_kwargs={"url": receiver.url})
    failed_before, sent_before = counted("flaky", "failed"), counted("flaky", "sent")
    fail(run_of("etl"))
    assert sending.send_due() == 1
    delivery = Delivery.objects.get()
    assert delivery.state == "pending"
    assert delivery.tries == 1
    assert f"HTTP {status}" in delivery.last_error
    assert delivery.next_try_at - DeliveryTry.objects.get().at == timedelta(seconds=1)
    assert sending.send_due() == 0  # not due yet
    assert sending.send_due(shared_now() + timedelta(seconds=1.5)) == 1
    delivery.refresh_from_db()
    assert delivery.state == "sent"
    assert delivery.tries == 2
    assert len(receiver.bodies) == 2
    assert list(DeliveryTry.objects.values_list("outcome", flat=True)) == ["failed", "sent"]
    assert (counted("flaky", "failed"), counted("flaky", "sent")) == (failed_before + 1, sent_before + 1)


def test_the_backoff_doubles_from_one_second_to_a_minute():
    assert [sending.retry_delay(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]


@pytest.mark.parametrize("receiver", [[500]], indirect=True)
def test_it_gives_up_after_the_retry_window(receiver, settings):
    settings.ORCHESTRATOR_ALERT_RETRY_FOR = 0
    rule("brief", notify="notifier:webhook", notify_kwargs={"url": receiver.url})
    fail(run_of("etl"))
    sending.send_due()
    assert Delivery.objects.get().state == "failed"


@pytest.mark.parametrize("receiver", [["hang"]], indirect=True)
def test_a_hanging_receiver_is_a_failed_try_and_never_delays_a_task(receiver, monkeypatch):
    """With the sender running, failing tasks' reports take no longer although every first try
    hangs; the hung try is given up at the bound and tried again."""
    monkeypatch.setattr(sending, "TRY_TIMEOUT", 1.0)
    rule("slow", notify="notifier:webhook", notify_kwargs={"url": receiver.url}, group_by=["dag_id"])
    sender = sending.Sender().start()
    try:
        runs = [run_of(f"chain{i}") for i in range(5)]
        started = time.monotonic()
        for run in runs:
            report = time.monotonic()
            fail(run)
            succeed(run)
            assert time.monotonic() - report < 1.0
        assert time.monotonic() - started < 5.0
        wait_for(lambda: Delivery.objects.filter(state="sent").count() == 5, timeout=20)
        hung = DeliveryTry.objects.filter(outcome="failed").get()
        assert "within 1s" in hung.error
        assert hung.seconds >= 0.9
    finally:
        sender.stop()


def test_the_sender_sends_within_seconds_of_the_event(receiver):
    rule("fast", notify="notifier:webhook", notify_kwargs={"url": receiver.url}, resolve=True)
    sender = sending.Sender().start()
    try:
        run = run_of("etl")
        fail(run)
        started = time.monotonic()
        wait_for(lambda: receiver.bodies, timeout=10)
        assert time.monotonic() - started < 10
        succeed(run)
        wait_for(lambda: len(receiver.bodies) == 2, timeout=15)
        assert receiver.bodies[1]["event"] == "resolved"
        assert Incident.objects.get().state == "resolved"
    finally:
        sender.stop()


def test_two_senders_make_each_try_once(receiver):
    rule("once", notify="notifier:webhook", notify_kwargs={"url": receiver.url})
    fail(run_of("etl"))
    incidents.absorb()
    now = shared_now()
    assert len(sending.claim_due(now, 10)) == 1
    assert sending.claim_due(now, 10) == []  # leased to the first
