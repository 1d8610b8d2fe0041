"""Counters kept in Redis, so that every process (workers, schedulers, web) adds to the same total.

/metrics renders them in the Prometheus text format (see orchestrator.api.prometheus), beside the
gauges it reads at scrape time (orchestrator.api.gauges).
"""
from __future__ import annotations

import json
import logging
from typing import cast

from orchestrator.foundation.redis_conn import get_redis

log = logging.getLogger(__name__)

TASK_FAILURES = "orchestrator_task_failures_total"
INFRASTRUCTURE_RETRIES = "orchestrator_infrastructure_retries_total"
DEADLINE_MISSES = "orchestrator_deadline_misses_total"
# A counter cannot take back what it counted: a failure an operator reclassifies stays in
# TASK_FAILURES under the category it had when it happened, and is counted here as moved.
RECLASSIFICATIONS = "orchestrator_reclassifications_total"
SPOOL_SET_ASIDE = "orchestrator_spool_set_aside_total"
SPOOL_FILES_REFUSED = "orchestrator_spool_files_refused_total"
SPOOL_UNWRITABLE = "orchestrator_spool_unwritable_total"
RESUME_DECISIONS = "orchestrator_resume_decisions_total"
ALERT_NOTIFICATIONS = "orchestrator_alert_notifications_total"

METRICS = {
    TASK_FAILURES: ("Failed task attempts by category and reason.", ("dag_id", "task_id", "category", "reason")),
    INFRASTRUCTURE_RETRIES: ("Retries charged to the platform budget.", ("dag_id", "task_id", "reason")),
    DEADLINE_MISSES: ("Deadlines missed.", ("dag_id",)),
    RECLASSIFICATIONS: (
        "Failed attempts an operator reclassified as the platform's (still counted in task_failures_total under their first category).",
        ("dag_id", "task_id", "from_category", "from_reason"),
    ),
    SPOOL_SET_ASIDE: ("Spooled reports no database would take, set aside by a worker.", ("worker_name",)),
    SPOOL_FILES_REFUSED: ("Files found in a worker's spool that the platform did not make (their seal does not verify), set aside, never delivered.", ("worker_name",)),
    SPOOL_UNWRITABLE: ("Outcomes a worker could neither deliver (the database away) nor spool (its spool unwritable): their leases let go, retried as the platform's.", ("worker_name",)),
    RESUME_DECISIONS: ("What resumable tasks decided at the start of an attempt.", ("decision",)),
    ALERT_NOTIFICATIONS: ("Tries at sending an alert notification, by rule and outcome (sent or failed).", ("rule", "outcome")),
}


def _key(name: str) -> str:
    return f"orchestrator:metrics:{name}"


def increment(name: str, amount: int = 1, **labels: str) -> None:
    """Add to a counter; a metrics outage is logged, never raised into the caller."""
    label_names = METRICS[name][1]
    field = json.dumps([str(labels[label]) for label in label_names])
    try:
        get_redis().hincrby(_key(name), field, amount)
    except Exception:
        log.warning("could not record metric %s", name, exc_info=True)


def read(name: str) -> list[tuple[dict[str, str], int]]:
    """Every labelled value of a counter."""
    label_names = METRICS[name][1]
    raw = cast("dict[bytes, bytes]", get_redis().hgetall(_key(name)))  # redis-py types a reply as maybe-awaitable, for its async client too
    return [(dict(zip(label_names, json.loads(field))), int(value)) for field, value in raw.items()]
