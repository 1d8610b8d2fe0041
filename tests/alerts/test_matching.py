"""Which rules an event matches, and its group: pure."""
from __future__ import annotations

from datetime import UTC, datetime

from alerts.matching import Event, Rule, group_key, group_of, matches

EVENT = Event(
    kind="task_failed", at=datetime(2026, 1, 1, tzinfo=UTC), dag_id="payments.settle", run_id="r", dag_run_id=1,
    owner="data-team", task_id="load", map_index=-1, task_instance_id=7, category="infrastructure", reason="worker_lost",
    fingerprint=None, queue="default",
)  # fmt: skip


def test_it_matches_only_when_every_filter_does():
    assert matches(Rule(1, "all", "task_failed"), EVENT)
    assert not matches(Rule(1, "other kind", "run_failed"), EVENT)
    assert matches(Rule(1, "any of", "task_failed", category=("application", "infrastructure")), EVENT)
    assert not matches(Rule(1, "reason", "task_failed", reason=("task_exception",)), EVENT)
    assert matches(Rule(1, "pattern", "task_failed", dag_id=("payments.*",)), EVENT)
    assert not matches(Rule(1, "pattern", "task_failed", dag_id=("billing.*",)), EVENT)
    assert matches(Rule(1, "task", "task_failed", task_id=("lo*",)), EVENT)
    assert not matches(Rule(1, "owner", "task_failed", owner=("platform",)), EVENT)
    no_owner = Event(**{**EVENT.__dict__, "owner": ""})
    assert not matches(Rule(1, "owner", "task_failed", owner=("data-team",)), no_owner)


def test_the_group_holds_the_rule_keys_and_null_for_what_is_missing():
    rule = Rule(1, "g", "task_failed", group_by=("owner", "category", "fingerprint"))
    group = group_of(rule, EVENT)
    assert group == {"owner": "data-team", "category": "infrastructure", "fingerprint": None}
    assert group_key(group) == group_key(dict(reversed(group.items())))
    assert group_of(Rule(1, "none", "task_failed"), EVENT) == {}
