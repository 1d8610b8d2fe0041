"""What a task process's environment holds: the worker's, without the platform's secrets. Pure."""
from __future__ import annotations

from collections.abc import Iterable, Mapping

# The platform's own connection strings and keys: a task has no business with them.
PLATFORM_SECRETS = frozenset({"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "EMAIL_URL"})
# Every platform setting is the platform's: none is the task's to read.
PLATFORM_PREFIX = "ORCHESTRATOR_"


def task_environment(worker_environment: Mapping[str, str], passthrough: Iterable[str] = ()) -> dict[str, str]:
    """The worker's environment minus DATABASE_URL, REDIS_URL, SECRET_KEY, EMAIL_URL and every
    ORCHESTRATOR_* setting, except the names listed in `passthrough`
    (ORCHESTRATOR_TASK_ENV_PASSTHROUGH). The task's own context variables (ORCHESTRATOR_DAG_ID
    and friends) are added later by the task process itself."""
    allowed = set(passthrough)
    return {
        name: value
        for name, value in worker_environment.items()
        if name in allowed or not (name in PLATFORM_SECRETS or name.startswith(PLATFORM_PREFIX))
    }
