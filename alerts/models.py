"""Alert rules, the incidents their events open, and the notifications sent for them.

An incident is unique per rule and group among the open ones: the database, not a lock, keeps
it one however many schedulers and workers record the same failure at once
(`incident_one_open_per_group`). The task instances and runs that fed an incident are kept as
plain ids, not foreign keys: history is deleted by the retention clean-up in bulk, and an
incident outlives the runs it was about.
"""
from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

NAME = RegexValidator(r"^[A-Za-z0-9_.\-]{1,100}$", "Use 1-100 letters, digits, '_', '.' or '-'.")


class When(models.TextChoices):
    TASK_FAILED = "task_failed"  # every failed attempt
    TASK_DEAD_LETTERED = "task_dead_lettered"
    RUN_FAILED = "run_failed"
    DEADLINE_MISSED = "deadline_missed"


# What a rule may group its incidents by: every event carries each of them (or null).
GROUP_KEYS = ("dag_id", "task_id", "owner", "category", "reason", "fingerprint", "queue")
# The filters of a rule, each a list that matches any of its values (dag_id, task_id: patterns).
FILTERS = ("category", "reason", "dag_id", "task_id", "owner")


class AlertRule(models.Model):
    name = models.CharField(max_length=100, unique=True, validators=[NAME])
    when = models.CharField(max_length=32, choices=When.choices)
    category = models.JSONField(default=list, blank=True)
    reason = models.JSONField(default=list, blank=True)
    dag_id = models.JSONField(default=list, blank=True, help_text="Shell-style patterns, e.g. payments.*")
    task_id = models.JSONField(default=list, blank=True, help_text="Shell-style patterns.")
    owner = models.JSONField(default=list, blank=True)
    notify = models.CharField(max_length=500, help_text='"notifier:webhook", "notifier:email", "notifier:log", or a dotted path.')
    notify_kwargs = models.JSONField(default=dict, blank=True)
    group_by = models.JSONField(default=list, blank=True)
    repeat_after = models.FloatField(null=True, blank=True, help_text="Seconds; empty: never repeat.")
    resolve = models.BooleanField(default=False, help_text="Notify when the incident is over.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Incident(models.Model):
    class State(models.TextChoices):
        OPEN = "open"
        RESOLVED = "resolved"

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="incidents")
    # The sha256 of the group's canonical JSON: what the uniqueness is about.
    group_key = models.CharField(max_length=64)
    group = models.JSONField(default=dict)
    state = models.CharField(max_length=16, choices=State.choices, default=State.OPEN)
    count = models.PositiveIntegerField(default=1)
    first_event_at = models.DateTimeField()
    last_event_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    # When the last notification (opened or repeat) was queued: a repeat is due repeat_after later.
    last_notified_at = models.DateTimeField()
    sample = models.JSONField(default=dict)

    class Meta:
        ordering = ["-last_event_at", "-id"]
        constraints = [
            # Two processes recording the same failure at once: the second insert fails and it
            # joins the first one's incident instead.
            models.UniqueConstraint(fields=["rule", "group_key"], condition=Q(state="open"), name="incident_one_open_per_group"),
        ]
        indexes = [
            # The sender's repeat and resolve checks, and the Alerts page's first rows: open incidents.
            models.Index(fields=["rule"], name="incident_open", condition=Q(state="open")),
        ]

    def __str__(self) -> str:
        return f"{self.rule.name} #{self.pk}"


class AlertEvent(models.Model):
    """An event a rule matched, not yet counted in an incident.

    Written where the event is recorded (a failed attempt: one INSERT in the failure report's own
    transaction, so the event commits with the failure or not at all), and taken by the sender,
    which counts it in its rule's incident and deletes it (`incidents.absorb`). No report ever
    updates an incident: a storm of failures of one group inserts rows, it does not queue on one.
    """

    # A plain id, not a foreign key: a foreign key would have every report lock the rule's row
    # (FOR KEY SHARE) and check it; an event whose rule has since been deleted is dropped.
    rule_id = models.BigIntegerField()
    # The rule's group of the event as it was matched (`matching.group_of`, `group_key`).
    group_key = models.CharField(max_length=64)
    group = models.JSONField(default=dict)
    at = models.DateTimeField()
    sample = models.JSONField(default=dict)
    dag_run_id = models.BigIntegerField()
    task_instance_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        indexes = [
            # The sender's close of an incident: none of its group's events is still pending.
            models.Index(fields=["rule_id", "group_key"], name="alert_event_group"),
        ]

    def __str__(self) -> str:
        return f"rule {self.rule_id} event #{self.pk}"

    def feed_key(self) -> str:
        return f"ti:{self.task_instance_id}" if self.task_instance_id is not None else f"run:{self.dag_run_id}"


class IncidentFeed(models.Model):
    """A task instance (or a run, for run events) whose event joined an incident: the incident is
    over when each of them has since succeeded."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="feeds")
    # "ti:ID" or "run:ID": one row per thing that fed it.
    key = models.CharField(max_length=40)
    dag_run_id = models.BigIntegerField()
    task_instance_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["incident", "key"], name="incident_feed_once")]
        indexes = [
            # The task page: the incidents a task instance fed.
            models.Index(fields=["task_instance_id"], name="incident_feed_task"),
        ]

    def __str__(self) -> str:
        return f"incident {self.incident_id} fed by {self.key}"


class Delivery(models.Model):
    """One notification of an incident (opened, repeat or resolved) and its tries."""

    class Event(models.TextChoices):
        OPENED = "opened"
        REPEAT = "repeat"
        RESOLVED = "resolved"

    class State(models.TextChoices):
        PENDING = "pending"  # not sent yet: its next try is at next_try_at
        SENT = "sent"
        FAILED = "failed"  # given up: a permanent error, or ORCHESTRATOR_ALERT_RETRY_FOR passed

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=16, choices=Event.choices)
    at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    tries = models.PositiveIntegerField(default=0)
    next_try_at = models.DateTimeField()
    # A sender claimed the next try until then (another sender leaves it alone).
    lease_until = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["at", "id"]
        indexes = [
            # The sender: pending deliveries whose next try is due.
            models.Index(fields=["next_try_at"], name="delivery_pending", condition=Q(state="pending")),
        ]

    def __str__(self) -> str:
        return f"{self.event} of incident {self.incident_id}: {self.state}"


class DeliveryTry(models.Model):
    """One try of a delivery: sent, or failed with its error."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempts")
    at = models.DateTimeField()
    outcome = models.CharField(max_length=16)  # sent | failed
    error = models.TextField(blank=True, default="")
    seconds = models.FloatField(default=0.0)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"try of delivery {self.delivery_id}: {self.outcome}"
