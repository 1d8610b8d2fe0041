"""A task's effective settings: system defaults, then the DAG's default_args, then the task's own."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings

from retries.policy import PlatformSettings, RetryArgs

if TYPE_CHECKING:  # for the annotations only
    from orchestrator.models import Task, TaskInstance

ARG_KEYS = (
    "retries",
    "retry_delay",
    "retry_backoff",
    "retry_max_delay",
    "retry_jitter",
    "execution_timeout",
    "kill_grace",
    "infrastructure_retry_limit",
    "poison_threshold",
    "queue",
    # Memory (retries/memory.py): the first attempt's limit in MiB, the limits after each
    # memory_limit_exceeded, and the queue of every attempt after the first one.
    "memory_limit",
    "memory_limit_on_retry",
    "queue_on_oom",
    # Waiting (docs/waiting.md): how long a wait or a rescheduling task may take in all, and
    # how often a wait_for task's wait is checked.
    "wait_timeout",
    "poke_interval",
)


def system_defaults() -> dict[str, Any]:
    """Defaults when neither the DAG nor the task sets a key (read at call time)."""
    return {
        "retries": 0,
        "retry_delay": 2.0,
        "retry_backoff": "exponential",
        "retry_max_delay": 600.0,
        "retry_jitter": "full",
        "execution_timeout": None,
        "kill_grace": settings.ORCHESTRATOR_KILL_GRACE,
        "infrastructure_retry_limit": settings.ORCHESTRATOR_INFRASTRUCTURE_RETRY_BUDGET,
        # 0 = never dead-letter: poison detection is opt-in per DAG or task.
        "poison_threshold": 0,
        "queue": "default",
        "memory_limit": None,
        "memory_limit_on_retry": [],
        "queue_on_oom": None,
        "wait_timeout": 604800.0,
        "poke_interval": 60.0,
    }


def merge_args(dag_default_args: dict[str, Any] | None, task_args: dict[str, Any] | None) -> dict[str, Any]:
    return {**system_defaults(), **(dag_default_args or {}), **(task_args or {})}


def effective_args(task: Task) -> dict[str, Any]:
    """`task` is an orchestrator.models.Task (with its dag loaded or loadable)."""
    return merge_args(task.dag.default_args, task.args)


def args_for(ti: TaskInstance) -> dict[str, Any]:
    """A task instance's effective arguments; a task removed from its DAG has only the DAG's."""
    return merge_args(ti.dag_run.dag.default_args, ti.definition.args if ti.definition else {})


@dataclass(frozen=True, slots=True)
class AttemptArgs:
    """What the worker's supervisor enforces on one attempt, read from the effective arguments
    once, where the claim reads them (a plain dataclass: the worker imports no pydantic)."""

    execution_timeout: float | None  # seconds from the handshake; None: no limit
    kill_grace: float  # seconds between SIGTERM and SIGKILL when it is stopped


def attempt_args(args: dict[str, Any]) -> AttemptArgs:
    """The effective arguments' attempt limits, typed. An execution_timeout left empty (null, or
    a blank string written before the spec checks refused one) means none."""
    timeout = args.get("execution_timeout")
    return AttemptArgs(
        execution_timeout=None if timeout is None or timeout == "" else float(timeout),
        kill_grace=float(args["kill_grace"]),
    )


def retry_args(args: dict[str, Any]) -> RetryArgs:
    return RetryArgs(
        retry_delay=float(args["retry_delay"]),
        retry_backoff=str(args["retry_backoff"]),
        retry_max_delay=float(args["retry_max_delay"]),
        retry_jitter=str(args["retry_jitter"]),
        infrastructure_retry_limit=int(args["infrastructure_retry_limit"]),
        poison_threshold=int(args["poison_threshold"]),
    )


def platform_settings() -> PlatformSettings:
    return PlatformSettings(
        infrastructure_retry_delay=float(settings.ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY),
        pre_execution_retries=int(settings.ORCHESTRATOR_PRE_EXECUTION_RETRIES),
        pre_execution_excluded_reasons=frozenset(settings.ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS),
    )
