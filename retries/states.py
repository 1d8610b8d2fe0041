"""Every state, category, reason, source and attempt kind, defined once (contract §3)."""
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


# A task in one of these states will not change again without an operator.
FINISHED_TASK_STATES = frozenset(
    {TaskState.SUCCESS, TaskState.FAILED, TaskState.UPSTREAM_FAILED, TaskState.SKIPPED, TaskState.REMOVED}
)
# States in which a worker may hold the task.
ACTIVE_TASK_STATES = frozenset({TaskState.QUEUED, TaskState.RUNNING})


class RunState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"


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
    TASK_EXCEPTION = "task_exception"
    STARTUP_ERROR = "startup_error"
    NONZERO_EXIT = "nonzero_exit"
    NON_RETRYABLE = "non_retryable"
    POISONED = "poisoned"
    # timeout
    EXECUTION_TIMEOUT = "execution_timeout"
    # user_action
    MANUAL_CLEAR = "manual_clear"
    MANUAL_MARK_SUCCESS = "manual_mark_success"
    MANUAL_MARK_FAILED = "manual_mark_failed"
    MANUAL_RECLASSIFY = "manual_reclassify"


CATEGORY_OF_REASON: dict[Reason, Category] = {
    Reason.WORKER_TERMINATION: Category.INFRASTRUCTURE,
    Reason.WORKER_LOST: Category.INFRASTRUCTURE,
    Reason.RESOURCE_EXHAUSTION: Category.INFRASTRUCTURE,
    Reason.DB_CONNECTION_ERROR: Category.INFRASTRUCTURE,
    Reason.PRE_EXECUTION_FAILURE: Category.INFRASTRUCTURE,
    Reason.QUEUE_LOST: Category.INFRASTRUCTURE,
    Reason.OPERATOR_RECLASSIFIED: Category.INFRASTRUCTURE,
    Reason.TASK_EXCEPTION: Category.APPLICATION,
    Reason.STARTUP_ERROR: Category.APPLICATION,
    Reason.NONZERO_EXIT: Category.APPLICATION,
    Reason.NON_RETRYABLE: Category.APPLICATION,
    Reason.POISONED: Category.APPLICATION,
    Reason.EXECUTION_TIMEOUT: Category.TIMEOUT,
    Reason.MANUAL_CLEAR: Category.USER_ACTION,
    Reason.MANUAL_MARK_SUCCESS: Category.USER_ACTION,
    Reason.MANUAL_MARK_FAILED: Category.USER_ACTION,
    Reason.MANUAL_RECLASSIFY: Category.USER_ACTION,
}


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
