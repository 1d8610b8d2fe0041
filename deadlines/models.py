"""Deadline definitions (part of a DAG's spec) and deadline instances (one per run or task)."""
from __future__ import annotations

from django.db import models
from django.db.models import Q

from orchestrator.models import Dag, DagRun, Task, TaskInstance


class Reference(models.TextChoices):
    DAGRUN_QUEUED_AT = "dagrun_queued_at"
    DAGRUN_LOGICAL_DATE = "dagrun_logical_date"
    FIXED_DATETIME = "fixed_datetime"
    AVERAGE_RUNTIME = "average_runtime"
    TASK_QUEUED_AT = "task_queued_at"
    TASK_STARTED_AT = "task_started_at"


DAG_REFERENCES = frozenset(
    {Reference.DAGRUN_QUEUED_AT, Reference.DAGRUN_LOGICAL_DATE, Reference.FIXED_DATETIME, Reference.AVERAGE_RUNTIME}
)
TASK_REFERENCES = frozenset({Reference.TASK_QUEUED_AT, Reference.TASK_STARTED_AT})


class DeadlineDefinition(models.Model):
    """A need-by rule of a DAG (task is null) or of one of its tasks."""

    dag = models.ForeignKey(Dag, on_delete=models.CASCADE, related_name="deadline_definitions")
    task = models.ForeignKey(Task, on_delete=models.CASCADE, null=True, blank=True, related_name="deadline_definitions")
    reference = models.CharField(max_length=32, choices=Reference.choices)
    interval = models.FloatField(default=0, help_text="Seconds added to the reference.")
    datetime = models.DateTimeField(null=True, blank=True, help_text="Only for fixed_datetime.")
    # fixed_datetime as written (naive = the DAG's timezone), so export gives back what was imported.
    datetime_text = models.CharField(max_length=64, blank=True, default="")
    callback = models.CharField(max_length=500, help_text='Dotted path, or "notifier:log|email|webhook".')
    callback_kwargs = models.JSONField(default=dict, blank=True)
    warn = models.BooleanField(default=False)
    days = models.JSONField(default=list, blank=True, help_text="e.g. [mon, tue, wed, thu, fri]; empty = every day")
    skip_dates = models.JSONField(default=list, blank=True)
    position = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["dag", "task", "position", "id"]

    def __str__(self) -> str:
        # A null foreign key reads as None without a query.
        scope = f"{self.dag.dag_id}.{self.task.task_id}" if self.task is not None else self.dag.dag_id
        return f"{scope}: {self.reference} + {self.interval:g}s"


class Deadline(models.Model):
    """One need-by time of one run (or task instance), checked until met or missed."""

    class State(models.TextChoices):
        PENDING = "pending"
        AT_RISK = "at_risk"
        MET = "met"
        MISSED = "missed"

    class CallbackState(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCESS = "success"
        FAILED = "failed"

    definition = models.ForeignKey(DeadlineDefinition, on_delete=models.SET_NULL, null=True, blank=True, related_name="instances")
    dag_run = models.ForeignKey(DagRun, on_delete=models.CASCADE, related_name="deadlines")
    task_instance = models.ForeignKey(TaskInstance, on_delete=models.CASCADE, null=True, blank=True, related_name="deadlines")
    scope = models.CharField(max_length=8, default="dag")  # dag | task
    task_id = models.CharField(max_length=250, null=True, blank=True)
    reference = models.CharField(max_length=32, choices=Reference.choices)
    callback = models.CharField(max_length=500)
    callback_kwargs = models.JSONField(default=dict, blank=True)
    warn = models.BooleanField(default=False)
    need_by = models.DateTimeField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    resolved_at = models.DateTimeField(null=True, blank=True)
    lateness_seconds = models.FloatField(null=True, blank=True)  # negative = met early by that much
    callback_state = models.CharField(max_length=10, choices=CallbackState.choices, null=True, blank=True)
    # Dispatches of the miss callback so far; also the token its current RQ job carries.
    callback_attempts = models.PositiveIntegerField(default=0)
    callback_error = models.TextField(blank=True, default="")
    # When the check next looks at the callback: a retry is due, or its job's lease ran out.
    callback_next_at = models.DateTimeField(null=True, blank=True)
    warned_at = models.DateTimeField(null=True, blank=True)
    # The at-risk warning's own callback (one attempt), kept apart from the miss callback.
    warn_callback_state = models.CharField(max_length=10, choices=CallbackState.choices, null=True, blank=True)

    class Meta:
        ordering = ["need_by", "id"]
        indexes = [
            # deadlines.check.check_due(): only due, unresolved rows are ever touched. need_by alone
            # (the state is in the condition) gives the due query an ordered scan that stops at the
            # batch size; (state, need_by) made it read and sort every due row (bench/).
            models.Index(fields=["need_by"], name="deadline_due", condition=Q(state__in=["pending", "at_risk"])),
            # deadlines.check.check_due(): callbacks whose retry is due or whose job went quiet.
            models.Index(
                fields=["callback_next_at"], name="deadline_callback_due", condition=Q(callback_state__in=["queued", "running"])
            ),
            # deadlines.check.check_due(): the early-warning pass looks only at pending rows with warn on.
            models.Index(fields=["need_by"], name="deadline_warn", condition=Q(state="pending", warn=True)),
        ]

    def __str__(self) -> str:
        return f"{self.dag_run} {self.scope} {self.reference} by {self.need_by:%Y-%m-%d %H:%M:%S} ({self.state})"


# A deadline in one of these states is still being watched.
OPEN_STATES = (Deadline.State.PENDING, Deadline.State.AT_RISK)
