"""The metadata database: DAG definitions, runs, task instances, their attempts and the audit log.

Task instance state changes go through `orchestrator.engine.transitions.transition()` only.
"""
from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from orchestrator.foundation.clock import shared_now
from retries.states import UNFINISHED_TASK_STATES, AttemptKind, CircuitState, RunState, TaskState, TriggerRule, WaitFor, choices

IDENTIFIER = RegexValidator(r"^[A-Za-z0-9_.\-]{1,250}$", "Use 1-250 letters, digits, '_', '.' or '-'.")
OWNER = RegexValidator(r"^[A-Za-z0-9_.\-]{1,100}$", "Use 1-100 letters, digits, '_', '.' or '-'.")


# The Django permissions an operator's actions need (the models' own, and those declared in
# their Meta): triggering runs, acting on task instances, pausing DAGs, operating circuits,
# approving a task that waits for an approval.
TRIGGER_PERMISSION = "orchestrator.trigger_dagrun"
ACT_PERMISSION = "orchestrator.change_taskinstance"
PAUSE_PERMISSION = "orchestrator.change_dag"
CIRCUIT_PERMISSION = "orchestrator.change_circuit"
APPROVE_PERMISSION = "orchestrator.approve_taskinstance"

class Dag(models.Model):
    dag_id = models.CharField(max_length=250, unique=True, validators=[IDENTIFIER])
    description = models.TextField(blank=True, default="")
    schedule = models.CharField(
        max_length=120, blank=True, null=True, help_text="Cron expression, @hourly/@daily/@weekly/@monthly, or empty for manual only."
    )
    timezone = models.CharField(max_length=64, default="UTC")
    start_date = models.DateTimeField(blank=True, null=True)
    catchup = models.BooleanField(default=False)
    paused = models.BooleanField(default=False)
    max_active_runs = models.PositiveIntegerField(default=16)
    # At most this many of the DAG's tasks queued or running over all its runs; null = no limit.
    max_active_tasks = models.PositiveIntegerField(blank=True, null=True)
    default_args = models.JSONField(default=dict, blank=True)
    # Run parameters: NAME -> a JSON Schema with an optional default and description
    # (orchestrator.foundation.run_params); strict_params: a conf key that is not one of them is refused.
    params = models.JSONField(default=dict, blank=True, help_text="NAME: a JSON Schema with an optional default and description.")
    strict_params = models.BooleanField(default=False, help_text="Refuse a conf key that is not a declared param.")
    # The team that owns it: alert rules route on it, the DAG list and the failures filter by it.
    owner = models.CharField(max_length=100, blank=True, default="", validators=[OWNER], help_text="The team that owns it, e.g. data-team.")
    # Scheduler bookkeeping: the logical date of the next scheduled run.
    next_run_logical_date = models.DateTimeField(blank=True, null=True)
    # The hash of the spec the DAG's tasks and deadlines were last imported from ("" once they
    # were edited otherwise): re-importing an unchanged file does not compare them row by row.
    spec_hash = models.CharField(max_length=64, blank=True, default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["dag_id"]
        verbose_name = "DAG"
        indexes = [
            # run_scheduler: DAGs whose next scheduled run is due.
            models.Index(fields=["next_run_logical_date"], name="dag_next_run_due", condition=Q(paused=False)),
        ]

    def __str__(self) -> str:
        return self.dag_id


class Task(models.Model):
    dag = models.ForeignKey(Dag, on_delete=models.CASCADE, related_name="tasks")
    task_id = models.CharField(max_length=250, validators=[IDENTIFIER])
    python_callable = models.CharField(max_length=500, blank=True, default="")
    bash_command = models.TextField(blank=True, default="")
    op_kwargs = models.JSONField(default=dict, blank=True)
    upstream = models.JSONField(default=list, blank=True, help_text="task_ids of this DAG")
    trigger_rule = models.CharField(max_length=20, choices=choices(TriggerRule), default=TriggerRule.ALL_SUCCESS)
    # Any default_args key set on this task alone; merged over the DAG's.
    args = models.JSONField(default=dict, blank=True)
    # A mapped task: {NAME: SOURCE}, SOURCE a list literal or "results.UPSTREAM_ID"; null = not mapped.
    expand = models.JSONField(blank=True, null=True)
    # A task that runs no process: {KIND: SPEC}, what the scheduler waits for (docs/waiting.md);
    # null for a python or bash task.
    wait_for = models.JSONField(blank=True, null=True)
    position = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["dag", "position", "id"]
        constraints = [models.UniqueConstraint(fields=["dag", "task_id"], name="task_unique_per_dag")]

    def __str__(self) -> str:
        return f"{self.dag.dag_id}.{self.task_id}"


class DagRun(models.Model):
    class RunType(models.TextChoices):
        MANUAL = "manual"
        SCHEDULED = "scheduled"
        BACKFILL = "backfill"

    dag = models.ForeignKey(Dag, on_delete=models.CASCADE, related_name="runs")
    run_id = models.CharField(max_length=250)
    run_type = models.CharField(max_length=16, choices=RunType.choices, default=RunType.MANUAL)
    state = models.CharField(max_length=16, choices=choices(RunState), default=RunState.QUEUED)
    conf = models.JSONField(default=dict, blank=True)
    logical_date = models.DateTimeField()
    queued_at = models.DateTimeField()
    start_date = models.DateTimeField(blank=True, null=True)
    end_date = models.DateTimeField(blank=True, null=True)
    triggered_by = models.CharField(max_length=150, blank=True, default="")
    # The backfill that made or re-ran this run: its runs count against the backfill's limit,
    # not the DAG's, and go on while the DAG is paused.
    backfill = models.ForeignKey("Backfill", on_delete=models.SET_NULL, null=True, blank=True, related_name="runs")

    class Meta:
        ordering = ["-queued_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["dag", "run_id"], name="dagrun_unique_run_id"),
            # Two schedulers creating the same scheduled run: the second insert fails.
            models.UniqueConstraint(
                fields=["dag", "logical_date"], condition=Q(run_type="scheduled"), name="dagrun_unique_scheduled_date"
            ),
        ]
        indexes = [
            # run_scheduler: the unfinished runs it advances every pass.
            models.Index(fields=["state"], name="dagrun_unfinished", condition=Q(state__in=["queued", "running"])),
        ]
        permissions = [("trigger_dagrun", "Can trigger DAG runs")]

    def __str__(self) -> str:
        return f"{self.dag.dag_id} {self.run_id}"


class Backfill(models.Model):
    """One run per logical date of a DAG's schedule in a range, started a few at a time by the
    scheduler (`orchestrator.engine.backfill_runs`)."""

    class State(models.TextChoices):
        RUNNING = "running"
        PAUSED = "paused"
        CANCELLED = "cancelled"
        SUCCESS = "success"
        FAILED = "failed"

    class Reprocess(models.TextChoices):
        NONE = "none"  # a date that has a run is skipped
        FAILED = "failed"  # a failed run is run again (its failed tasks cleared)
        COMPLETED = "completed"  # a failed or successful run is run again (every task cleared)

    dag = models.ForeignKey(Dag, on_delete=models.CASCADE, related_name="backfills")
    state = models.CharField(max_length=16, choices=State.choices, default=State.RUNNING)
    from_date = models.DateTimeField()
    to_date = models.DateTimeField()
    reprocess = models.CharField(max_length=16, choices=Reprocess.choices, default=Reprocess.NONE)
    max_active_runs = models.PositiveIntegerField(default=10)
    backwards = models.BooleanField(default=False)
    conf = models.JSONField(default=dict, blank=True)
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField()
    end_date = models.DateTimeField(blank=True, null=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # run_scheduler: the backfills whose runs it starts (engine.backfill_runs.start_runs).
            models.Index(fields=["state"], name="backfill_running", condition=Q(state="running")),
        ]

    def __str__(self) -> str:
        return f"backfill {self.pk} of {self.dag.dag_id}"


class BackfillDate(models.Model):
    """One logical date of a backfill: what it does there and whether its run has started."""

    class Action(models.TextChoices):
        CREATE = "create"
        SKIP = "skip"
        RERUN = "rerun"

    class State(models.TextChoices):
        PENDING = "pending"  # its run has not started yet
        STARTED = "started"  # dag_run is (or was) running for the backfill
        SKIPPED = "skipped"  # nothing to do: a run exists that the reprocess behaviour leaves alone
        CANCELLED = "cancelled"  # the backfill was cancelled before its run started

    backfill = models.ForeignKey(Backfill, on_delete=models.CASCADE, related_name="dates")
    logical_date = models.DateTimeField()
    action = models.CharField(max_length=8, choices=Action.choices)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    dag_run = models.ForeignKey(DagRun, on_delete=models.SET_NULL, null=True, blank=True, related_name="backfill_dates")

    class Meta:
        ordering = ["backfill", "logical_date"]
        constraints = [models.UniqueConstraint(fields=["backfill", "logical_date"], name="backfill_date_unique")]
        indexes = [
            # run_scheduler: a backfill's next dates to start, and its started runs to count.
            models.Index(fields=["backfill", "state", "logical_date"], name="backfill_date_state"),
        ]

    def __str__(self) -> str:
        return f"{self.logical_date.isoformat()} {self.action} ({self.state})"


class TaskInstance(models.Model):
    # No index of its own: the unique (dag_run, task_id, map_index) index leads with the run and
    # serves every lookup by run. With a second index on the run alone, PostgreSQL picked that one
    # for a run newer than its statistics (estimated at one row) and read the whole run to find
    # one task: a mapped task's every claim read its 10,000 siblings to find their upstream.
    dag_run = models.ForeignKey(DagRun, on_delete=models.CASCADE, related_name="task_instances", db_index=False)
    # The definition it was created from; null once the task is removed from the DAG.
    definition = models.ForeignKey(Task, on_delete=models.SET_NULL, null=True, blank=True, related_name="instances")
    task_id = models.CharField(max_length=250)
    # -1 for a task that is not mapped (or not expanded yet); 0..n-1 for an instance of a mapped task.
    map_index = models.IntegerField(default=-1)
    state = models.CharField(max_length=20, choices=choices(TaskState), default=TaskState.NONE)
    try_number = models.PositiveIntegerField(default=0)
    max_tries = models.PositiveIntegerField(default=1)
    infrastructure_try_number = models.PositiveIntegerField(default=0)
    infrastructure_retry_limit = models.PositiveIntegerField(default=5)
    # Platform requeues of pre-execution failures within the current user try.
    pre_execution_tries = models.PositiveIntegerField(default=0)
    # True when the next dispatch repeats the current user try (a platform retry).
    retry_is_platform = models.BooleanField(default=False)
    # Fencing token: grows by one on every dispatch; every report must carry the current one.
    attempt_token = models.PositiveIntegerField(default=0)
    queue = models.CharField(max_length=100, default="default")
    next_retry_at = models.DateTimeField(blank=True, null=True)
    queued_at = models.DateTimeField(blank=True, null=True)
    start_date = models.DateTimeField(blank=True, null=True)
    end_date = models.DateTimeField(blank=True, null=True)
    heartbeat_at = models.DateTimeField(blank=True, null=True)
    failure_fingerprint = models.CharField(max_length=12, blank=True, null=True)
    fingerprint_streak = models.PositiveIntegerField(default=0)
    last_failure_context = models.JSONField(blank=True, null=True)
    hostname = models.CharField(max_length=255, blank=True, default="")
    worker_name = models.CharField(max_length=255, blank=True, default="")
    pid = models.IntegerField(blank=True, null=True)
    # Copied from the task's settings when the run is created, as `queue` is: what it holds
    # and whom it waits behind.
    pool = models.CharField(max_length=250, blank=True, null=True)
    pool_slots = models.PositiveIntegerField(default=1)
    priority_weight = models.IntegerField(default=1)
    circuit = models.CharField(max_length=250, blank=True, null=True)
    # Null, or {"kind", "name", "since"} while the task is ready but held by a pool, a limit,
    # a circuit or a paused queue.
    waiting_for = models.JSONField(blank=True, null=True)
    # Its turn in a circuit's ramp after the circuit closed: not dispatched before this.
    release_at = models.DateTimeField(blank=True, null=True)
    # What the task returned, written with its success by the attempt that succeeded.
    result = models.JSONField(blank=True, null=True)
    # A mapped task's instance: its item of the source, given to it as `NAME` (set when it expands).
    map_item = models.JSONField(blank=True, null=True)
    # Grows each time a clear empties the task state: part of the task's idempotency key.
    task_state_epoch = models.PositiveIntegerField(default=0, db_default=0)
    # MiB: the memory limit of its next attempts once one went past its limit (stepped up by
    # retries/memory.py); null until then: the task's own `memory_limit` holds.
    memory_limit_mib = models.PositiveIntegerField(blank=True, null=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["dag_run", "id"]
        # A mapped task expands once: a second expansion's INSERT fails on this.
        constraints = [
            models.UniqueConstraint(fields=["dag_run", "task_id", "map_index"], name="ti_unique_per_run_map_index")
        ]
        indexes = [
            # run_scheduler: tasks waiting to be dispatched or watched for lost workers/jobs.
            models.Index(
                fields=["state", "next_retry_at"],
                name="ti_schedulable",
                condition=Q(state__in=["none", "scheduled", "up_for_retry", "queued", "running"]),
            ),
            # /api/v1/failures and the failures page.
            models.Index(fields=["state", "dag_run"], name="ti_state_run"),
            # A run's unfinished tasks: a report's bounded looks at them (reporting._Ended,
            # run_reads.downstream_may_settle, run_reads.upstream_states) and whether the run is over. The
            # queries say `state IN` these states, which the planner matches to this index; read
            # through the run's every row instead, a look cost a 10,000-task run's report 10,000 rows.
            models.Index(
                fields=["dag_run", "task_id"],
                name="ti_run_unfinished",
                condition=Q(state__in=sorted(str(state) for state in UNFINISHED_TASK_STATES)),
            ),
            # Slots a pool has given out, tasks a circuit holds.
            models.Index(fields=["pool", "state"], name="ti_pool_state", condition=Q(pool__isnull=False)),
            models.Index(fields=["circuit", "state"], name="ti_circuit_state", condition=Q(circuit__isnull=False)),
        ]
        permissions = [("approve_taskinstance", "Can approve or reject a task waiting for an approval")]

    def __str__(self) -> str:
        return f"{self.label} ({self.state})"

    @property
    def label(self) -> str:
        """The task id, with a mapped instance's map_index: `load[3]`."""
        return self.task_id if self.map_index < 0 else f"{self.task_id}[{self.map_index}]"

    @property
    def job_id(self) -> str:
        return job_id_for(self.pk, self.attempt_token)


def job_id_for(task_instance_id: int, attempt_token: int) -> str:
    """The RQ job id of one dispatch: derived from the task instance and its attempt token."""
    return f"ti-{task_instance_id}-{attempt_token}"


class TaskAttempt(models.Model):
    """One dispatch of a task instance to a worker, whether or not its process ever started."""

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCESS = "success"
        FAILED = "failed"
        RESCHEDULED = "rescheduled"  # the task raised Reschedule: charged to neither budget

    task_instance = models.ForeignKey(TaskInstance, on_delete=models.CASCADE, related_name="attempts")
    attempt_token = models.PositiveIntegerField()
    try_number = models.PositiveIntegerField()
    infrastructure_try_number = models.PositiveIntegerField()
    kind = models.CharField(max_length=10, choices=choices(AttemptKind), default=AttemptKind.USER)
    state = models.CharField(max_length=20, choices=State.choices, default=State.QUEUED)
    queued_at = models.DateTimeField()
    start_date = models.DateTimeField(blank=True, null=True)
    end_date = models.DateTimeField(blank=True, null=True)
    context = models.JSONField(blank=True, null=True)
    fingerprint = models.CharField(max_length=12, blank=True, null=True)
    result = models.JSONField(blank=True, null=True)
    stdout = models.TextField(blank=True, default="")
    stderr = models.TextField(blank=True, default="")
    output_truncated = models.BooleanField(default=False)
    hostname = models.CharField(max_length=255, blank=True, default="")
    worker_name = models.CharField(max_length=255, blank=True, default="")
    pid = models.IntegerField(blank=True, null=True)
    # What a resumable task decided on this attempt (reattached, already_succeeded, ...).
    resume = models.CharField(max_length=20, blank=True, null=True)
    # A mapped instance's item as it was dispatched (its task's map_item then): which item this
    # attempt ran with, kept when the task expands again over another list. Null when not mapped.
    item = models.JSONField(blank=True, null=True)
    # MiB: the memory limit it ran with (null: none), and the most its processes used, measured
    # where it had a limit (null where not measured).
    memory_limit_mib = models.PositiveIntegerField(blank=True, null=True)
    peak_memory_mib = models.PositiveIntegerField(blank=True, null=True)

    class Meta:
        ordering = ["task_instance", "attempt_token"]
        constraints = [
            models.UniqueConstraint(fields=["task_instance", "attempt_token"], name="attempt_unique_token")
        ]
        indexes = [
            # /api/v1/failures?since=: failed attempts by time.
            models.Index(fields=["end_date"], name="attempt_failed_end", condition=Q(state="failed")),
        ]

    def __str__(self) -> str:
        return f"{self.task_instance_id}#{self.attempt_token} {self.state}"


class TaskWait(models.Model):
    """What an up_for_reschedule task waits for: one row per waiting task instance, with the time
    of its next check. The scheduler's check claims a due wait by moving `next_check_at` on with
    a conditional update (`engine/waits.py`); the wait ends with a move of its task fenced by
    `attempt_token` like any report, so two schedulers (or an event and a check) end it once.

    A rescheduled python task's row stays while the task is dispatched again, so its wait_timeout
    counts from its first reschedule; a clear deletes it.
    """

    task_instance = models.OneToOneField(TaskInstance, on_delete=models.CASCADE, related_name="wait")
    kind = models.CharField(max_length=32, choices=choices(WaitFor))
    # The wait_for kind's own spec ({"name": ...} for an event, {"url": ...} for http, ...).
    spec = models.JSONField(default=dict, blank=True)
    # An event's name: what `POST /api/v1/events` looks a waiting task up by.
    event_name = models.CharField(max_length=250, blank=True, default="")
    # The task's attempt this wait belongs to: ending the wait is fenced by it.
    attempt_token = models.PositiveIntegerField()
    since = models.DateTimeField()  # the first reschedule, or the wait's first check
    timeout_at = models.DateTimeField()
    # When it is next checked (a rescheduled task: dispatched again); for an event or an
    # approval, its timeout. Null while a rescheduled task is back on the schedule.
    next_check_at = models.DateTimeField(blank=True, null=True)
    poke_interval = models.FloatField(default=60.0)
    checks = models.PositiveIntegerField(default=0)
    last_check = models.JSONField(blank=True, null=True)  # what the last check saw (http: status)

    class Meta:
        indexes = [
            # run_scheduler: the due waits it checks in batches (engine/waits.check_due).
            models.Index(fields=["next_check_at"], name="wait_due", condition=Q(next_check_at__isnull=False)),
            # POST /api/v1/events: the tasks waiting for an event name.
            models.Index(fields=["event_name"], name="wait_event_name", condition=~Q(event_name="")),
        ]

    def __str__(self) -> str:
        return f"{self.task_instance_id} waits for {self.kind}"


class TaskStateEntry(models.Model):
    """One key of a task instance's own store, kept across its attempts (context["task_state"]).

    Written only through `engine.task_state_store.apply()`, fenced by the writing attempt's token.
    """

    task_instance = models.ForeignKey(TaskInstance, on_delete=models.CASCADE, related_name="state_entries")
    key = models.CharField(max_length=250)
    value = models.JSONField(null=True)
    written_at = models.DateTimeField()
    # The attempt that last wrote it: its token, and its try numbers as the task saw them.
    attempt_token = models.PositiveIntegerField()
    try_number = models.PositiveIntegerField()
    infrastructure_try_number = models.PositiveIntegerField()

    class Meta:
        ordering = ["task_instance", "key"]
        constraints = [models.UniqueConstraint(fields=["task_instance", "key"], name="task_state_unique_key")]

    def __str__(self) -> str:
        return f"{self.task_instance_id}:{self.key}"


class FailureCount(models.Model):
    """How many attempts failed in one UTC hour under one key, kept as they fail.

    Written only by `orchestrator.engine.failure_counts` (in the transaction of the write that
    makes an attempt `failed` or changes its context); the failures page sums these rows for
    the whole hours of its window. Text parts of the key are "" (never NULL) when absent, so
    that two failures with no fingerprint land on the same row.
    """

    hour = models.DateTimeField()
    # Deleting a DAG deletes its attempts, so it deletes their counts too.
    dag = models.ForeignKey(Dag, on_delete=models.CASCADE, related_name="+")
    task_id = models.CharField(max_length=250)
    category = models.CharField(max_length=64)
    reason = models.CharField(max_length=64)
    hostname = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=12)
    n = models.IntegerField()

    class Meta:
        constraints = [
            # The upsert's conflict target; hour first, so it also serves the failures page's
            # `hour >= first whole hour of the window`.
            models.UniqueConstraint(
                fields=["hour", "dag", "task_id", "category", "reason", "hostname", "fingerprint"], name="failurecount_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H:00} {self.category}/{self.reason} {self.task_id}: {self.n}"


def audit_time() -> datetime:
    """When an audit entry is written: the shared clock's time, which the engine's times (an
    attempt's end, say) are compared with, not the web host's. Named here so that migrations
    do not depend on where the engine keeps its clock."""
    return shared_now()


class AuditLog(models.Model):
    """Who did what to which task or run, and what it was before."""

    at = models.DateTimeField(default=audit_time, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    username = models.CharField(max_length=150, blank=True, default="")
    action = models.CharField(max_length=40)
    dag_id = models.CharField(max_length=250)
    run_id = models.CharField(max_length=250, blank=True, default="")
    task_id = models.CharField(max_length=250, blank=True, default="")
    prior_state = models.CharField(max_length=20, blank=True, default="")
    new_state = models.CharField(max_length=20, blank=True, default="")
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.username} {self.action} {self.dag_id}/{self.run_id}/{self.task_id}"


class ApiToken(models.Model):
    """A bearer token for API clients; only its SHA-256 is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(blank=True, null=True)

    def __str__(self) -> str:
        return f"token of {self.user} ({self.created_at:%Y-%m-%d})"


class Pool(models.Model):
    """Named slots: tasks naming the pool hold `pool_slots` of them while queued or running."""

    name = models.CharField(max_length=250, unique=True, validators=[IDENTIFIER])
    slots = models.PositiveIntegerField()
    description = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.slots})"


class Circuit(models.Model):
    """A circuit breaker over the tasks that call one downstream; created when a task names it.

    The tunables are null when the setting's default applies.
    """

    name = models.CharField(max_length=250, unique=True, validators=[IDENTIFIER])
    state = models.CharField(max_length=10, choices=choices(CircuitState), default=CircuitState.CLOSED)
    opened_at = models.DateTimeField(blank=True, null=True)
    closed_at = models.DateTimeField(blank=True, null=True)
    # The half-open circuit's one probe: the task instance and the attempt token it went with.
    probe_task_instance_id = models.IntegerField(blank=True, null=True)
    probe_token = models.PositiveIntegerField(blank=True, null=True)
    window = models.FloatField(blank=True, null=True, help_text="Seconds; empty = ORCHESTRATOR_CIRCUIT_WINDOW.")
    min_attempts = models.PositiveIntegerField(blank=True, null=True, help_text="Empty = ORCHESTRATOR_CIRCUIT_MIN_ATTEMPTS.")
    failure_rate = models.FloatField(blank=True, null=True, help_text="0-1; empty = ORCHESTRATOR_CIRCUIT_FAILURE_RATE.")
    cooldown = models.FloatField(blank=True, null=True, help_text="Seconds; empty = ORCHESTRATOR_CIRCUIT_COOLDOWN.")
    ramp = models.FloatField(blank=True, null=True, help_text="Seconds; empty = ORCHESTRATOR_CIRCUIT_RAMP.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"
