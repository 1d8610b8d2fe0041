"""Sending notifications: one try of one delivery, and the sender that makes them.

The sender runs in the scheduler process on threads of its own (`Sender`), never on a worker's
report path nor in the scheduler's pass: it counts the events the reports queued in their
incidents (`incidents.absorb`, which queues an incident's `opened` notification), claims due
deliveries with a conditional update (a
lease, so two schedulers never make the same try), sends each with at most TRY_TIMEOUT
seconds for an answer on a bounded pool of threads, and records every try. A failed try
(an error, a non-2xx answer, no answer in time) is tried again after an exponential backoff from
1 s, capped at 60 s, until ORCHESTRATOR_ALERT_RETRY_FOR seconds after the notification was
queued; a permanent error (a host not allowed any more, a notifier that does not import) ends it
at once.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.mail import get_connection, send_mail
from django.db import close_old_connections, connections, transaction
from django.db.models import Q

from alerts import incidents
from alerts.models import Delivery, DeliveryTry, Incident
from deadlines import notifiers
from deadlines.callbacks import call_in_thread, call_user, describe, load_callable
from orchestrator.data import metrics
from orchestrator.foundation.clock import shared_now
from retries.backoff import Backoff, ceiling

log = logging.getLogger(__name__)

TRY_TIMEOUT = 10.0  # seconds a receiver has to answer one try
LEASE = TRY_TIMEOUT + 20.0  # a claimed try's lease: its bound and time to record it
BACKOFF_BASE, BACKOFF_CAP = 1.0, 60.0
ERROR_LIMIT = 1000
SENT, FAILED = "sent", "failed"
POLL = 0.5  # seconds between the sender's looks for due deliveries
CHECK_EVERY = 2.0  # seconds between its looks for repeats and incidents that are over
THREADS = 4


def retry_delay(tries: int) -> float:
    """The wait after failed try number `tries` (1-based): 1, 2, 4, ... seconds, at most 60."""
    return ceiling(tries, BACKOFF_BASE, Backoff.EXPONENTIAL, BACKOFF_CAP)


def retry_for() -> float:
    return float(getattr(settings, "ORCHESTRATOR_ALERT_RETRY_FOR", 3600.0))


# --- what is sent --------------------------------------------------------------------------------


def incident_url(incident: Incident) -> str:
    """The incident on the Alerts page: absolute with ORCHESTRATOR_BASE_URL, else relative."""
    return f"{settings.ORCHESTRATOR_BASE_URL}/alerts/?rule={incident.rule.name}#incident-{incident.pk}"


def summary(payload: dict[str, Any]) -> str:
    """One line for Slack and mail subjects."""
    sample = payload.get("sample") or {}
    where = ".".join(str(part) for part in (sample.get("dag_id"), sample.get("task_id")) if part)
    group = ", ".join(f"{key}={value}" for key, value in (payload.get("group") or {}).items())
    cause = "/".join(str(part) for part in (sample.get("category"), sample.get("reason")) if part)
    words = [f"[{payload['event']}]", f"{payload['rule']}:", f"{payload['count']} event{'s' if payload['count'] != 1 else ''}"]
    if group:
        words.append(f"({group})")
    if where:
        words.append(f"latest {where}")
    if cause:
        words.append(cause)
    return " ".join(words)


def payload(delivery: Delivery) -> dict[str, Any]:
    """The notification's JSON body: the incident as it is when it is sent."""
    incident = delivery.incident
    body: dict[str, Any] = {
        "event": delivery.event,
        "rule": incident.rule.name,
        "group": incident.group,
        "count": incident.count,
        "first_event_at": incident.first_event_at.isoformat(),
        "last_event_at": incident.last_event_at.isoformat(),
        "sample": incident.sample,
        "url": incident_url(incident),
    }
    if (incident.rule.notify_kwargs or {}).get("format") == "slack":
        body["text"] = summary(body)
    return body


# --- the notifiers -------------------------------------------------------------------------------


def _log(body: dict[str, Any], *, timeout: float, level: str = "warning", message: str = "") -> None:
    logging.getLogger("alerts.notifier").log(
        notifiers.LOG_LEVELS.get(level, logging.WARNING), "%s%s %s", summary(body), f": {message}" if message else "",
        json.dumps(body, sort_keys=True),
    )  # fmt: skip


def _email(
    body: dict[str, Any], *, timeout: float, to: str | list[str] | None = None, subject: str = "", from_email: str = ""
) -> None:
    recipients = [to] if isinstance(to, str) else list(to or [])
    if not recipients:
        raise notifiers.NotifierError("notifier:email needs notify_kwargs.to", permanent=True)
    text = summary(body) + "\n\n" + json.dumps(body, indent=2, sort_keys=True)
    send_mail(subject or summary(body), text, from_email or settings.DEFAULT_FROM_EMAIL, recipients, connection=get_connection(timeout=timeout))


def _webhook(body: dict[str, Any], *, timeout: float, url: str = "", headers: dict[str, str] | None = None) -> None:
    notifiers.webhook_notifier(body, timeout=timeout, url=url, headers=headers)


BUILT_IN: dict[str, Callable[..., None]] = {"log": _log, "email": _email, "webhook": _webhook}


def call_notifier(notify: str, kwargs: dict[str, Any], body: dict[str, Any], *, timeout: float) -> None:
    """Send `body` with the rule's notifier, within `timeout` seconds (CallbackTimeout after)."""
    kwargs = {k: v for k, v in kwargs.items() if k != "format"}
    if notify.startswith(notifiers.PREFIX):
        name = notify[len(notifiers.PREFIX) :]
        if name not in BUILT_IN:
            raise notifiers.NotifierError(f"unknown notifier {name!r}", permanent=True)
        function = BUILT_IN[name]
        call_in_thread(lambda: function(body, timeout=timeout, **kwargs), timeout, name="alert-notifier")
        return
    user_function = load_callable(notify)
    call_in_thread(lambda: call_user(user_function, kwargs, body), timeout, name="alert-notifier")


# --- one try -------------------------------------------------------------------------------------


def claim_due(now: datetime, limit: int) -> list[tuple[int, int]]:
    """Claim up to `limit` due tries: (delivery id, its tries so far) for each claimed."""
    due = (
        Delivery.objects.filter(state=Delivery.State.PENDING, next_try_at__lte=now)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .order_by("next_try_at", "id")
        .values_list("id", "tries", "lease_until")[:limit]
    )
    claimed: list[tuple[int, int]] = []
    for delivery_id, tries, lease in list(due):
        won = Delivery.objects.filter(pk=delivery_id, state=Delivery.State.PENDING, tries=tries, lease_until=lease).update(
            lease_until=now + timedelta(seconds=LEASE)
        )
        if won:
            claimed.append((delivery_id, tries))
    return claimed


def send_one(delivery_id: int, tries: int) -> str:
    """Make one claimed try of a delivery and record it; its outcome (sent or failed)."""
    delivery = Delivery.objects.select_related("incident__rule").filter(pk=delivery_id, tries=tries).first()
    if delivery is None:
        return "stale"
    rule = delivery.incident.rule
    started = time.monotonic()
    error: BaseException | None = None
    try:
        call_notifier(rule.notify, dict(rule.notify_kwargs or {}), payload(delivery), timeout=TRY_TIMEOUT)
    except Exception as exc:
        error = exc
    seconds = time.monotonic() - started
    now = shared_now()
    outcome = SENT if error is None else FAILED
    changes: dict[str, Any] = {"tries": tries + 1, "lease_until": None}
    text = ""
    if error is None:
        changes["state"] = Delivery.State.SENT
    else:
        # Messages name a webhook's host, never its URL (deadlines.notifiers): safe to keep and log.
        text = describe(error)[:ERROR_LIMIT]
        next_try = now + timedelta(seconds=retry_delay(tries + 1))
        gave_up = bool(getattr(error, "permanent", False)) or next_try > delivery.at + timedelta(seconds=retry_for())
        changes.update(last_error=text, next_try_at=next_try, state=Delivery.State.FAILED if gave_up else Delivery.State.PENDING)
        log.warning(
            "alert %s (rule %s, incident %s) try %d failed%s: %s",
            delivery.event, rule.name, delivery.incident_id, tries + 1, "; giving up" if gave_up else "", text,
        )  # fmt: skip
    with transaction.atomic():
        DeliveryTry.objects.create(delivery_id=delivery_id, at=now, outcome=outcome, error=text, seconds=seconds)
        Delivery.objects.filter(pk=delivery_id, tries=tries).update(**changes)
    metrics.increment(metrics.ALERT_NOTIFICATIONS, rule=rule.name, outcome=outcome)
    return outcome


def send_due(now: datetime | None = None, limit: int = 50) -> int:
    """Count the queued events in their incidents, then claim and make every due try in this
    thread, one after another; how many tries were made."""
    incidents.absorb()
    claimed = claim_due(now or shared_now(), limit)
    for delivery_id, tries in claimed:
        send_one(delivery_id, tries)
    return len(claimed)


def check(now: datetime | None = None) -> None:
    """The periodic look: repeats that are due, incidents that are over (the queued events
    counted first)."""
    now = now or shared_now()
    incidents.absorb()
    incidents.queue_repeats(now)
    incidents.resolve_over(now)


# --- the sender ----------------------------------------------------------------------------------


class Sender:
    """The scheduler's sender: a loop on a thread of its own, tries on a pool of THREADS.

    A hanging receiver holds one pool thread for at most TRY_TIMEOUT (its abandoned call is left
    behind): never the scheduler's pass, never a task."""

    def __init__(self, threads: int = THREADS) -> None:
        self.threads = threads
        self.stopping = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="alert-send")
        self.busy = 0
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.run, name="alert-sender", daemon=True)

    def start(self) -> Sender:
        self.thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        self.thread.join(timeout)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def run(self) -> None:
        last_check = 0.0
        while not self.stopping.is_set():
            try:
                close_old_connections()
                self.absorb()
                if time.monotonic() - last_check >= CHECK_EVERY:
                    check()
                    last_check = time.monotonic()
                self.step()
            except Exception:
                log.exception("alert sender step failed; trying again")
                connections.close_all()
            self.stopping.wait(POLL)
        connections.close_all()

    @staticmethod
    def absorb() -> int:
        """Count every queued event in its incident (a storm in batches); how many."""
        taken = total = incidents.absorb()
        while taken >= incidents.ABSORB_BATCH:
            taken = incidents.absorb()
            total += taken
        return total

    def step(self) -> int:
        """Claim what the pool has room for and hand each try to it."""
        with self.lock:
            room = self.threads - self.busy
        if room <= 0:
            return 0
        claimed = claim_due(shared_now(), room)
        for delivery_id, tries in claimed:
            with self.lock:
                self.busy += 1
            self.pool.submit(self._send, delivery_id, tries)
        return len(claimed)

    def _send(self, delivery_id: int, tries: int) -> None:
        try:
            send_one(delivery_id, tries)
        except Exception:
            log.exception("alert delivery %s: could not make or record a try", delivery_id)
        finally:
            connections.close_all()  # this pool thread's connection
            with self.lock:
                self.busy -= 1
