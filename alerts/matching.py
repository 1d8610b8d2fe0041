"""Which rules an event matches and the group it joins: pure, no database."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from fnmatch import fnmatchcase
from typing import Any

from orchestrator.foundation.sanitise import clean

MESSAGE_LIMIT = 500


@dataclass(frozen=True)
class Event:
    """One thing that happened that a rule may be about (`kind` is a `When`)."""

    kind: str
    at: datetime
    dag_id: str
    run_id: str
    dag_run_id: int
    owner: str = ""
    task_id: str | None = None
    map_index: int | None = None
    task_instance_id: int | None = None
    category: str | None = None
    reason: str | None = None
    fingerprint: str | None = None
    queue: str | None = None
    message: str = ""

    def value(self, key: str) -> str | None:
        """An event's value for a group_by key (owner: null when the DAG has none)."""
        value = getattr(self, key)
        return value or None if isinstance(value, str) else value

    def sample(self) -> dict[str, Any]:
        """The event as a notification shows it, storable whatever a task wrote (no NUL, no lone
        surrogate: it is stored in the reporter's transaction, which must not fail on it)."""
        return clean({
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "map_index": self.map_index,
            "category": self.category,
            "reason": self.reason,
            "message": self.message[:MESSAGE_LIMIT],
        })[0]

    def feed_key(self) -> str:
        return f"ti:{self.task_instance_id}" if self.task_instance_id is not None else f"run:{self.dag_run_id}"


@dataclass(frozen=True)
class Rule:
    """What matching needs of an AlertRule, kept per process (`rules_cache`)."""

    id: int
    name: str
    when: str
    category: tuple[str, ...] = ()
    reason: tuple[str, ...] = ()
    dag_id: tuple[str, ...] = ()
    task_id: tuple[str, ...] = ()
    owner: tuple[str, ...] = ()
    group_by: tuple[str, ...] = ()

    @classmethod
    def of(cls, rule: Any) -> Rule:
        return cls(
            rule.pk, rule.name, rule.when, tuple(rule.category), tuple(rule.reason), tuple(rule.dag_id),
            tuple(rule.task_id), tuple(rule.owner), tuple(rule.group_by),
        )  # fmt: skip


def matches(rule: Rule, event: Event) -> bool:
    """Every filter the rule has matches (a list matches any of its values; an empty one, all)."""
    if rule.when != event.kind:
        return False
    if rule.category and event.category not in rule.category:
        return False
    if rule.reason and event.reason not in rule.reason:
        return False
    if rule.dag_id and not any(fnmatchcase(event.dag_id, pattern) for pattern in rule.dag_id):
        return False
    if rule.task_id and (event.task_id is None or not any(fnmatchcase(event.task_id, p) for p in rule.task_id)):
        return False
    return not (rule.owner and event.owner not in rule.owner)


def group_of(rule: Rule, event: Event) -> dict[str, Any]:
    """{KEY: VALUE} for the rule's group_by keys (storable, as the sample)."""
    return clean({key: event.value(key) for key in rule.group_by})[0]


def group_key(group: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(group, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
