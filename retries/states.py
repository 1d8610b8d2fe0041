"""The state machine: every state, category, reason, source and attempt kind, defined once,
and which states each move may start from.

The engine's moves (dispatch, the worker's reports, the scheduler's settling, the operator's
actions) each name their legal prior states here; `orchestrator.engine.transitions.transition()`
applies a move only from the state it read, so this file reads as the whole state machine.
"""
from enum import StrEnum


class TaskState(StrEnum):
    NONE = "none"
    SCHEDULED = "scheduled"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    UP_FOR_RETRY = "up_for_retry"
    UPSTREAM_FAILED = "upstream_failed"
    SKIPPED = "skipped"
    DEAD_LETTER = "dead_letter"
    REMOVED = "removed"
    # Waiting without holding a slot: a task that raised Reschedule, or a `wait_for` task whose
    # wait the scheduler checks (or an event or an approval completes).
    UP_FOR_RESCHEDULE = "up_for_reschedule"


class RunState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"


UNFINISHED_RUN_STATES = frozenset({RunState.QUEUED, RunState.RUNNING})
FINISHED_RUN_STATES = frozenset({RunState.SUCCESS, RunState.FAILED})


# --- task states: groups ---------------------------------------------------------------------------

# A task in one of these states will not change again without an operator; its downstream
# tasks may be settled. A dead-lettered task is not finished: it waits for an operator.
FINISHED_TASK_STATES = frozenset(
    {TaskState.SUCCESS, TaskState.FAILED, TaskState.UPSTREAM_FAILED, TaskState.SKIPPED, TaskState.REMOVED}
)
# Every other state: the task may still change by itself (a dead-lettered one waits for an operator).
UNFINISHED_TASK_STATES = frozenset(TaskState) - FINISHED_TASK_STATES
# Finished states that count as a failure for trigger rules and for the run's outcome.
FAILED_TASK_STATES = frozenset({TaskState.FAILED, TaskState.UPSTREAM_FAILED})
# States in which a worker may hold the task.
ACTIVE_TASK_STATES = frozenset({TaskState.QUEUED, TaskState.RUNNING})
# Ready or waiting for its retry: the scheduler dispatches it once next_retry_at has passed.
WAITING_TO_RUN_STATES = frozenset({TaskState.SCHEDULED, TaskState.UP_FOR_RETRY})
# Moving on by itself: a waiting client (trigger_dag --wait) keeps waiting.
IN_FLIGHT_TASK_STATES = WAITING_TO_RUN_STATES | ACTIVE_TASK_STATES | {TaskState.UP_FOR_RESCHEDULE}

# --- task states: the legal prior states of each move ----------------------------------------------

# The scheduler settles a waiting task: scheduled, upstream_failed, skipped or removed.
SETTLE_FROM = frozenset({TaskState.NONE})
# dispatch(): a new attempt token, state queued.
DISPATCH_FROM = WAITING_TO_RUN_STATES
# The worker took the job (claim) and the task process said "running" (mark_running).
CLAIM_FROM = frozenset({TaskState.QUEUED})
MARK_RUNNING_FROM = frozenset({TaskState.QUEUED})
HEARTBEAT_FROM = ACTIVE_TASK_STATES
REPORT_SUCCESS_FROM = frozenset({TaskState.RUNNING})
# A failure is reported for a running task, or for a queued one whose process never said
# "running" (a pre-execution failure).
REPORT_FAILURE_FROM = ACTIVE_TASK_STATES
# A running python task raised Reschedule: its attempt ends `rescheduled`, the task waits.
RESCHEDULE_FROM = frozenset({TaskState.RUNNING})
# A wait ends (met, failed, timed out, an event, an approval) only while the task waits; a
# rescheduled task's wait over, it goes back on the schedule with the same try.
WAIT_END_FROM = frozenset({TaskState.UP_FOR_RESCHEDULE})
# Operator actions. Tasks a worker may hold are never cleared or reclassified.
CLEAR_FROM = FINISHED_TASK_STATES | {TaskState.DEAD_LETTER, TaskState.UP_FOR_RETRY, TaskState.UP_FOR_RESCHEDULE}
# Clearing with downstream also resets downstream tasks that are merely scheduled.
CLEAR_DOWNSTREAM_FROM = CLEAR_FROM | {TaskState.SCHEDULED}
MARK_SUCCESS_FROM = frozenset(
    {
        TaskState.FAILED,
        TaskState.UP_FOR_RETRY,
        TaskState.DEAD_LETTER,
        TaskState.UPSTREAM_FAILED,
        TaskState.NONE,
        TaskState.SCHEDULED,
        TaskState.SKIPPED,
        TaskState.UP_FOR_RESCHEDULE,
    }
)
MARK_FAILED_FROM = (MARK_SUCCESS_FROM - {TaskState.FAILED}) | {TaskState.SUCCESS}
# Reclassify gives back the retry a failure took: these states go back on the schedule.
RESCHEDULED_BY_RECLASSIFY = frozenset({TaskState.FAILED, TaskState.DEAD_LETTER})
# A task held by a pool, a limit or a circuit waits in these states; setting or clearing
# its `waiting_for` is legal only from them (dispatch clears it on its way to queued).
HOLD_FROM = WAITING_TO_RUN_STATES
# Tasks that hold pool slots and count against max_active_tasks / max_active_tis_per_dag.
SLOT_HOLDING_STATES = ACTIVE_TASK_STATES


class WaitKind(StrEnum):
    """What a ready task is held by (its `waiting_for.kind`)."""

    POOL = "pool"
    MAX_ACTIVE_TASKS = "max_active_tasks"
    # A task's own caps: on all its runs (max_active_tis_per_dag) or on one run's instances of a
    # mapped task (max_active_tis_per_dagrun). Either is shown under this one kind, named by the
    # task's id: the kinds are a closed list clients read.
    MAX_ACTIVE_TIS_PER_DAG = "max_active_tis_per_dag"
    CIRCUIT = "circuit"
    QUEUE = "queue"  # its queue is paused by an infrastructure storm
    WAIT = "wait"  # up_for_reschedule: its name is the wait's kind (WaitFor)


class WaitFor(StrEnum):
    """What an up_for_reschedule task waits for: a `wait_for` kind, or `reschedule` for a
    python task that raised Reschedule."""

    RESCHEDULE = "reschedule"
    TIME = "time"
    TIME_AFTER_LOGICAL_DATE = "time_after_logical_date"
    DAG_RUN = "dag_run"
    HTTP = "http"
    EVENT = "event"
    APPROVAL = "approval"


# Waits nothing but a person or a sender completes: no check is due (their `next_check_at` is
# null), only their wait_timeout.
WAITS_WITHOUT_CHECKS = frozenset({WaitFor.EVENT, WaitFor.APPROVAL})
# The `wait_for` kinds of a spec (a rescheduled task's wait is no spec's).
SPEC_WAIT_KINDS = tuple(kind.value for kind in WaitFor if kind is not WaitFor.RESCHEDULE)


class CircuitState(StrEnum):
    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"


# The gauge value of orchestrator_circuit_state for each state.
CIRCUIT_GAUGE = {CircuitState.CLOSED: 0, CircuitState.HALF_OPEN: 1, CircuitState.OPEN: 2}
# An operator may open a circuit from any state, close one that is not closed, and force a
# probe of one that is open (skipping the rest of its cool-down).
CIRCUIT_OPEN_FROM = frozenset({CircuitState.CLOSED, CircuitState.HALF_OPEN, CircuitState.OPEN})
CIRCUIT_CLOSE_FROM = frozenset({CircuitState.HALF_OPEN, CircuitState.OPEN})
CIRCUIT_PROBE_FROM = frozenset({CircuitState.OPEN, CircuitState.HALF_OPEN})


class Category(StrEnum):
    INFRASTRUCTURE = "infrastructure"
    APPLICATION = "application"
    TIMEOUT = "timeout"
    USER_ACTION = "user_action"


class Reason(StrEnum):
    # infrastructure
    WORKER_TERMINATION = "worker_termination"
    WORKER_LOST = "worker_lost"
    RESOURCE_EXHAUSTION = "resource_exhaustion"
    DB_CONNECTION_ERROR = "db_connection_error"
    PRE_EXECUTION_FAILURE = "pre_execution_failure"
    QUEUE_LOST = "queue_lost"
    OPERATOR_RECLASSIFIED = "operator_reclassified"
    # application
    INVALID_RESULT = "invalid_result"
    MEMORY_LIMIT_EXCEEDED = "memory_limit_exceeded"
    WAIT_FAILED = "wait_failed"
    INVALID_EXPAND = "invalid_expand"
    TASK_EXCEPTION = "task_exception"
    STARTUP_ERROR = "startup_error"
    NONZERO_EXIT = "nonzero_exit"
    NON_RETRYABLE = "non_retryable"
    POISONED = "poisoned"
    # timeout
    EXECUTION_TIMEOUT = "execution_timeout"
    WAIT_TIMEOUT = "wait_timeout"
    # user_action
    MANUAL_CLEAR = "manual_clear"
    MANUAL_MARK_SUCCESS = "manual_mark_success"
    MANUAL_MARK_FAILED = "manual_mark_failed"
    MANUAL_RECLASSIFY = "manual_reclassify"
    REJECTED = "rejected"


CATEGORY_OF_REASON: dict[Reason, Category] = {
    Reason.WORKER_TERMINATION: Category.INFRASTRUCTURE,
    Reason.WORKER_LOST: Category.INFRASTRUCTURE,
    Reason.RESOURCE_EXHAUSTION: Category.INFRASTRUCTURE,
    Reason.DB_CONNECTION_ERROR: Category.INFRASTRUCTURE,
    Reason.PRE_EXECUTION_FAILURE: Category.INFRASTRUCTURE,
    Reason.QUEUE_LOST: Category.INFRASTRUCTURE,
    Reason.OPERATOR_RECLASSIFIED: Category.INFRASTRUCTURE,
    Reason.INVALID_RESULT: Category.APPLICATION,
    Reason.WAIT_FAILED: Category.APPLICATION,
    Reason.MEMORY_LIMIT_EXCEEDED: Category.APPLICATION,
    Reason.INVALID_EXPAND: Category.APPLICATION,
    Reason.TASK_EXCEPTION: Category.APPLICATION,
    Reason.STARTUP_ERROR: Category.APPLICATION,
    Reason.NONZERO_EXIT: Category.APPLICATION,
    Reason.NON_RETRYABLE: Category.APPLICATION,
    Reason.POISONED: Category.APPLICATION,
    Reason.EXECUTION_TIMEOUT: Category.TIMEOUT,
    Reason.WAIT_TIMEOUT: Category.TIMEOUT,
    Reason.MANUAL_CLEAR: Category.USER_ACTION,
    Reason.MANUAL_MARK_SUCCESS: Category.USER_ACTION,
    Reason.MANUAL_MARK_FAILED: Category.USER_ACTION,
    Reason.MANUAL_RECLASSIFY: Category.USER_ACTION,
    Reason.REJECTED: Category.USER_ACTION,
}


# Infrastructure failures the platform budget retries: every infrastructure reason.
PLATFORM_RETRYABLE = frozenset(reason for reason, category in CATEGORY_OF_REASON.items() if category is Category.INFRASTRUCTURE)
# Failures that end the task at once, whatever tries are left: the task said so, its wait ran
# out of time, what it waited for ended otherwise, or an approver said no.
NOT_RETRIED = frozenset({Reason.NON_RETRYABLE, Reason.WAIT_TIMEOUT, Reason.WAIT_FAILED, Reason.REJECTED})


class Source(StrEnum):
    WORKER = "worker"
    EXECUTOR = "executor"
    SCHEDULER = "scheduler"
    API = "api"


class AttemptKind(StrEnum):
    USER = "user"
    PLATFORM = "platform"


class PreExecutionReason(StrEnum):
    """Why a task died before its "running" handshake: the analogue of a container reason."""

    ERROR = "error"  # the task process started and exited on its own, non-zero, no signal
    KILLED = "killed"  # the task process died by a signal
    START_ERROR = "start_error"  # the task process could not be started
    WORKER_DIED = "worker_died"  # the worker died before or while starting it


class TriggerRule(StrEnum):
    ALL_SUCCESS = "all_success"
    ALL_DONE = "all_done"
    ONE_SUCCESS = "one_success"
    ONE_FAILED = "one_failed"
    NONE_FAILED = "none_failed"


def choices(enum: type[StrEnum]) -> list[tuple[str, str]]:
    """Django `choices` for a StrEnum."""
    return [(member.value, member.value) for member in enum]


# Failures that count against a circuit: the downstream answered badly or too slowly.
CIRCUIT_FAILURE_CATEGORIES = frozenset({Category.APPLICATION, Category.TIMEOUT})
