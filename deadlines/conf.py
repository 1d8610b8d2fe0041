"""The deadlines app's tunables, read from django.conf.settings at call time (never at import).

None of them needs setting: each has a default. They exist so an installation (or a test,
with override_settings) can change them without code.
"""
from __future__ import annotations

from django.conf import settings

DEFAULTS: dict[str, float] = {
    # average_runtime: need_by = queued_at + mean duration of the last WINDOW successful runs,
    # applied only once MIN_RUNS such runs exist.
    "ORCHESTRATOR_AVERAGE_RUNTIME_WINDOW": 10,
    "ORCHESTRATOR_AVERAGE_RUNTIME_MIN_RUNS": 3,
    # Callbacks: the bound on one call (callback_kwargs "timeout" overrides it per deadline),
    # how many dispatches in all, and the base of the backoff between them.
    "ORCHESTRATOR_DEADLINE_CALLBACK_TIMEOUT": 30,
    "ORCHESTRATOR_DEADLINE_CALLBACK_ATTEMPTS": 3,
    "ORCHESTRATOR_DEADLINE_CALLBACK_RETRY_DELAY": 5,
    # How long a queued callback job may wait in Redis before the check looks for it.
    "ORCHESTRATOR_DEADLINE_CALLBACK_QUEUE_LEASE": 120,
    # Early warning: median of the last WINDOW successful attempts of each task, only when
    # every unfinished task has at least MIN_SAMPLES of them.
    "ORCHESTRATOR_DEADLINE_RISK_WINDOW": 5,
    "ORCHESTRATOR_DEADLINE_RISK_MIN_SAMPLES": 3,
}


def setting(name: str) -> float:
    """The value of one tunable: the Django setting if present, else its default."""
    return getattr(settings, name, DEFAULTS[name])


def int_setting(name: str) -> int:
    return int(setting(name))
