"""Incidents: an event a rule matched is queued where it is recorded (one INSERT, in the
reporter's own transaction); the sender takes the queued events, joins each group's to its
rule's open incident or opens one, queues repeats and closes what is over.

Every change is a conditional update or an insert the database may refuse, so any number of
schedulers may take events, repeat and resolve at once: an event row is counted by whoever
deletes it; the unique open incident per rule and group (`incident_one_open_per_group`) makes
a second opener join the first one's incident; a repeat is queued by whoever moves
`last_notified_at` from what it read; a close is fenced by the count it read and waits for its
group's queued events, so an event that joined meanwhile keeps the incident open.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import Exists, F, OuterRef

from alerts import rules_cache
from alerts.matching import Event, group_key, group_of, matches
from alerts.models import AlertEvent, AlertRule, Delivery, Incident, IncidentFeed
from orchestrator.data import sql
from orchestrator.foundation.clock import shared_now
from orchestrator.models import DagRun, TaskInstance
from retries.states import RunState, TaskState

log = logging.getLogger(__name__)

# Tries at joining or opening before giving up (each lost race is another process's incident
# opening or closing at the same moment).
RECORD_TRIES = 5
# Events the sender takes in one look, and of one group in one transaction.
ABSORB_BATCH = 1000


def queue_events(events: Iterable[Event]) -> int:
    """Match the events against the cached rules of their kind and queue one row per event and
    rule it matches, all in one INSERT (in the caller's transaction, if any); how many. No rule
    about an event's kind: no query. A database error is the caller's (it fails the caller's
    transaction, and the event with it); anything else is logged and queues nothing."""
    try:
        rows = [
            {"rule_id": rule.id, "group_key": group_key(group), "group": group, "at": event.at, "sample": event.sample(),
             "dag_run_id": event.dag_run_id, "task_instance_id": event.task_instance_id}
            for event in events
            for rule in rules_cache.rules_for(event.kind)
            if matches(rule, event)
            for group in (group_of(rule, event),)
        ]  # fmt: skip
    except DatabaseError:
        raise  # the rules' read: the caller's transaction cannot go on
    except Exception:
        log.exception("could not match events against the alert rules")
        return 0
    if rows:
        _insert_events(rows)
    return len(rows)


EVENT_COLUMNS = ("rule_id", "group_key", "group", "at", "sample", "dag_run_id", "task_instance_id")


def _insert_events(rows: list[dict[str, Any]]) -> None:
    """One INSERT of the rows, written directly (it runs in a failure report: compiling a
    bulk_create cost more than the database spent on the statement), with Django's own
    adaptation of each value."""
    fields = [sql.column_field(AlertEvent, name) for name in EVENT_COLUMNS]
    quote = connection.ops.quote_name
    values = ", ".join([f"({sql.placeholders(len(fields))})"] * len(rows))
    sql.execute(
        f"INSERT INTO {quote(AlertEvent._meta.db_table)} ({', '.join(quote(field.column) for field in fields)}) VALUES {values}",
        [field.get_db_prep_save(row[field.name], connection) for row in rows for field in fields],
    )


# --- the sender's steps ----------------------------------------------------------------------------


def absorb(limit: int = ABSORB_BATCH) -> int:
    """Count the oldest `limit` queued events in their incidents, one transaction per rule and
    group (their incident updated once however many they are); how many events were taken.
    Events of a rule deleted since are dropped."""
    groups = list(dict.fromkeys(AlertEvent.objects.order_by("id").values_list("rule_id", "group_key")[:limit]))
    if not groups:
        return 0
    rules = set(AlertRule.objects.filter(pk__in={rule_id for rule_id, _ in groups}).values_list("pk", flat=True))
    taken = 0
    for rule_id, key in groups:
        try:
            taken += _absorb_group(rule_id, key, limit, alive=rule_id in rules)
        except Exception:
            # Its events stay queued for the next look; the other groups go on.
            log.exception("could not count the queued events of alert rule %s in their incident", rule_id)
    return taken


class _Raced(Exception):
    """Another sender took some of the events read: roll back and look again later."""


def _absorb_group(rule_id: int, key: str, limit: int, *, alive: bool) -> int:
    try:
        with transaction.atomic():
            pending = AlertEvent.objects.filter(rule_id=rule_id, group_key=key).order_by("id")
            if connection.features.has_select_for_update_skip_locked:
                pending = pending.select_for_update(skip_locked=True)  # another sender's rows: theirs
            events = list(pending[:limit])
            if not events:
                return 0
            deleted, _ = AlertEvent.objects.filter(pk__in=[event.pk for event in events]).delete()
            if deleted != len(events):
                raise _Raced
            if alive:
                count_in_incident(rule_id, key, events[0].group, events)
            return len(events)
    except _Raced:
        return 0


def count_in_incident(rule_id: int, key: str, group: dict, events: Sequence[AlertEvent]) -> int:
    """Join the rule's open incident of the group with the events, or open one with them (and
    queue its `opened` notification); the incident's id."""
    latest = max(events, key=lambda event: (event.at, event.pk or 0))
    first_at = min(event.at for event in events)
    for _ in range(RECORD_TRIES):
        with transaction.atomic():
            incident_id = _join(rule_id, key, len(events), latest)
            if incident_id is None:
                incident_id = _open(rule_id, key, group, len(events), first_at, latest)
            if incident_id is None:
                continue  # lost a race with another opener (or a close): look again
            feeds = {event.feed_key(): event for event in events}
            IncidentFeed.objects.bulk_create(
                [IncidentFeed(incident_id=incident_id, key=feed, dag_run_id=event.dag_run_id,
                              task_instance_id=event.task_instance_id) for feed, event in feeds.items()],
                ignore_conflicts=True,
            )  # fmt: skip
            return incident_id
    raise RuntimeError(f"alert rule {rule_id}: no incident after {RECORD_TRIES} tries")


def _join(rule_id: int, key: str, count: int, latest: AlertEvent) -> int | None:
    open_ids = Incident.objects.filter(rule_id=rule_id, group_key=key, state=Incident.State.OPEN).values_list("id", flat=True)
    incident_id = open_ids.first()
    if incident_id is None:
        return None
    joined = Incident.objects.filter(pk=incident_id, state=Incident.State.OPEN).update(count=F("count") + count)
    if not joined:
        return None
    # The latest event's time; events counted late do not move it back.
    Incident.objects.filter(pk=incident_id, last_event_at__lt=latest.at).update(last_event_at=latest.at, sample=latest.sample)
    return incident_id


def _open(rule_id: int, key: str, group: dict, count: int, first_at: datetime, latest: AlertEvent) -> int | None:
    now = shared_now()  # the notification is queued (and due) now, however long ago its first event was
    try:
        with transaction.atomic():  # a savepoint: the refused insert leaves the transaction usable
            incident = Incident.objects.create(
                rule_id=rule_id,
                group_key=key,
                group=group,
                count=count,
                first_event_at=first_at,
                last_event_at=latest.at,
                last_notified_at=now,
                sample=latest.sample,
            )
    except IntegrityError:
        return None  # another process opened it first: join it
    Delivery.objects.create(incident=incident, event=Delivery.Event.OPENED, at=first_at, next_try_at=now)
    return incident.pk


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
    queued = AlertEvent.objects.filter(rule_id=OuterRef("rule_id"), group_key=OuterRef("group_key"))
    over = (
        Incident.objects.filter(state=Incident.State.OPEN)
        .annotate(failing=_still_failing(), queued=Exists(queued))
        # An event of its group still queued is a feed not counted yet: not over.
        .filter(failing=False, queued=False)
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
