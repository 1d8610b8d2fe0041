"""Incidents: an event joins its rule's open incident of the same group, or opens one; the
sender's periodic steps queue repeats and close what is over.

Every change is a conditional update or an insert the database may refuse, so any number of
workers and schedulers may record, repeat and resolve at once: the unique open incident per
rule and group (`incident_one_open_per_group`) makes a second opener join the first one's
incident; a repeat is queued by whoever moves `last_notified_at` from what it read; a close
is fenced by the count it read, so an event that joined meanwhile keeps the incident open.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef

from alerts import rules_cache
from alerts.matching import Event, Rule, group_key, group_of, matches
from alerts.models import Delivery, Incident, IncidentFeed
from orchestrator.models import DagRun, TaskInstance
from retries.states import RunState, TaskState

log = logging.getLogger(__name__)

# Tries at joining or opening before giving up (each lost race is another process's incident
# opening or closing at the same moment).
RECORD_TRIES = 5


def record_event(event: Event) -> list[int]:
    """Match the event against the rules of its kind and record it in each matching rule's
    incident; the ids of those incidents. A rule whose recording fails is logged and skipped:
    an alert never fails what reported the event."""
    incident_ids: list[int] = []
    for rule in rules_cache.rules_for(event.kind):
        if not matches(rule, event):
            continue
        try:
            incident_ids.append(record(rule, event))
        except Exception:
            log.exception("could not record a %s event of %s in alert rule %s", event.kind, event.dag_id, rule.name)
    return incident_ids


def record(rule: Rule, event: Event) -> int:
    """Join the rule's open incident with the event's group, or open one (and queue its
    `opened` notification); the incident's id."""
    group = group_of(rule, event)
    key = group_key(group)
    for _ in range(RECORD_TRIES):
        with transaction.atomic():
            incident_id = _join(rule, key, event)
            if incident_id is None:
                incident_id = _open(rule, key, group, event)
            if incident_id is None:
                continue  # lost a race with another opener (or a close): look again
            IncidentFeed.objects.bulk_create(
                [IncidentFeed(incident_id=incident_id, key=event.feed_key(), dag_run_id=event.dag_run_id,
                              task_instance_id=event.task_instance_id)],
                ignore_conflicts=True,
            )  # fmt: skip
            return incident_id
    raise RuntimeError(f"rule {rule.name}: no incident after {RECORD_TRIES} tries")


def _join(rule: Rule, key: str, event: Event) -> int | None:
    open_ids = Incident.objects.filter(rule_id=rule.id, group_key=key, state=Incident.State.OPEN).values_list("id", flat=True)
    incident_id = open_ids.first()
    if incident_id is None:
        return None
    joined = Incident.objects.filter(pk=incident_id, state=Incident.State.OPEN).update(count=F("count") + 1)
    if not joined:
        return None
    # The latest event's time; a report that is late does not move it back.
    Incident.objects.filter(pk=incident_id, last_event_at__lt=event.at).update(last_event_at=event.at, sample=event.sample())
    return incident_id


def _open(rule: Rule, key: str, group: dict, event: Event) -> int | None:
    try:
        with transaction.atomic():  # a savepoint: the refused insert leaves the transaction usable
            incident = Incident.objects.create(
                rule_id=rule.id,
                group_key=key,
                group=group,
                count=1,
                first_event_at=event.at,
                last_event_at=event.at,
                last_notified_at=event.at,
                sample=event.sample(),
            )
    except IntegrityError:
        return None  # another process opened it first: join it
    Delivery.objects.create(incident=incident, event=Delivery.Event.OPENED, at=event.at, next_try_at=event.at)
    return incident.pk


# --- the sender's periodic steps ---------------------------------------------------------------


def queue_repeats(now: datetime) -> int:
    """Queue a `repeat` for each open incident whose rule repeats and whose last notification is
    repeat_after old; how many were queued."""
    due = Incident.objects.filter(state=Incident.State.OPEN, rule__repeat_after__isnull=False).values_list(
        "id", "last_notified_at", "rule__repeat_after"
    )
    queued = 0
    for incident_id, last, repeat_after in due:
        if repeat_after is None or last + timedelta(seconds=repeat_after) > now:
            continue
        with transaction.atomic():
            moved = Incident.objects.filter(pk=incident_id, state=Incident.State.OPEN, last_notified_at=last).update(
                last_notified_at=now
            )
            if moved:
                Delivery.objects.create(incident_id=incident_id, event=Delivery.Event.REPEAT, at=now, next_try_at=now)
                queued += 1
    return queued


def _still_failing() -> Exists:
    """A feed of the outer incident whose task instance has not succeeded since, nor its run."""
    ti_succeeded = TaskInstance.objects.filter(pk=OuterRef("task_instance_id"), state=TaskState.SUCCESS)
    run_succeeded = DagRun.objects.filter(pk=OuterRef("dag_run_id"), state=RunState.SUCCESS)
    run_exists = DagRun.objects.filter(pk=OuterRef("dag_run_id"))
    failing = (
        IncidentFeed.objects.filter(incident=OuterRef("pk"))
        .annotate(ti_ok=Exists(ti_succeeded), run_ok=Exists(run_succeeded), run_kept=Exists(run_exists))
        # A run deleted by the retention clean-up is over as far as its incident goes.
        .filter(ti_ok=False, run_ok=False, run_kept=True)
    )
    return Exists(failing)


def resolve_over(now: datetime) -> int:
    """Close each open incident every feed of which has since succeeded (or its run), queueing
    its `resolved` notification when its rule asks for one; how many were closed. An incident
    without `resolve` closes the same way, silently, so that a later event opens a new one."""
    over = (
        Incident.objects.filter(state=Incident.State.OPEN)
        .annotate(failing=_still_failing())
        .filter(failing=False)
        .values_list("id", "count", "rule__resolve")
    )
    closed = 0
    for incident_id, count, notify in over:
        with transaction.atomic():
            moved = Incident.objects.filter(pk=incident_id, state=Incident.State.OPEN, count=count).update(
                state=Incident.State.RESOLVED, resolved_at=now
            )
            if moved and notify:
                Delivery.objects.create(incident_id=incident_id, event=Delivery.Event.RESOLVED, at=now, next_try_at=now)
            closed += moved
    return closed
