"""The deadlines app's tunables, read from django.conf.settings at call time (never at import).

None of them needs setting: `orchestrator/settings.py` reads each from the environment with
its default. What they mean:

- `ORCHESTRATOR_AVERAGE_RUNTIME_WINDOW`, `ORCHESTRATOR_AVERAGE_RUNTIME_MIN_RUNS`: an
  `average_runtime` need-by is queued_at + the mean duration of the last WINDOW successful
  runs, applied only once MIN_RUNS such runs exist.
- `ORCHESTRATOR_DEADLINE_CALLBACK_TIMEOUT`, `..._ATTEMPTS`, `..._RETRY_DELAY`: the bound on one
  callback call (callback_kwargs "timeout" overrides it per deadline), how many dispatches in
  all, and the base of the backoff between them.
- `ORCHESTRATOR_DEADLINE_CALLBACK_QUEUE_LEASE`: how long a queued callback job may wait in
  Redis before the check looks for it.
- `ORCHESTRATOR_DEADLINE_RISK_WINDOW`, `..._MIN_SAMPLES`: early warning uses the median of the
  last WINDOW successful attempts of each task, only when every unfinished task has at least
  MIN_SAMPLES of them.
"""
from __future__ import annotations

from django.conf import settings


def setting(name: str) -> float:
    """The value of one tunable."""
    return getattr(settings, name)


def int_setting(name: str) -> int:
    return int(setting(name))
