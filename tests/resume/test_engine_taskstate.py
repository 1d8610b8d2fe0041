"""engine/taskstate: what an attempt starts with, fenced writes, and a clear's new key."""
from __future__ import annotations

import pytest

from orchestrator.engine import task_state_store
from orchestrator.engine.reporting import report_success
from orchestrator.models import TaskStateEntry
from tests.api.factories import chain_dag, make_run, start

pytestmark = pytest.mark.django_db


def test_an_attempt_starts_with_its_entries_and_key_in_one_read(django_assert_num_queries):
    run = make_run(chain_dag("etl"))
    ti = start(run, "extract")
    with django_assert_num_queries(1):
        first = task_state_store.start(ti.pk, "etl", run.run_id, "extract")
    assert first.entries == {}
    changes = [{"op": "set", "key": "a", "value": {"x": [1]}}, {"op": "set", "key": "b", "value": None}]
    assert task_state_store.apply(ti.pk, ti.attempt_token, changes)
    again = task_state_store.start(ti.pk, "etl", run.run_id, "extract")
    assert again.entries == {"a": {"x": [1]}, "b": None}
    assert again.idempotency_key == first.idempotency_key
    task_state_store.empty([ti.pk])
    cleared = task_state_store.start(ti.pk, "etl", run.run_id, "extract")
    assert cleared.entries == {}
    assert cleared.idempotency_key != first.idempotency_key


def test_only_the_current_running_attempt_writes():
    run = make_run(chain_dag("etl"))
    ti = start(run, "extract")
    assert not task_state_store.apply(ti.pk, ti.attempt_token - 1, [{"op": "set", "key": "a", "value": 1}])
    assert task_state_store.apply(ti.pk, ti.attempt_token, [{"op": "set", "key": "a", "value": 2}])
    assert report_success(ti.pk, ti.attempt_token)
    assert not task_state_store.apply(ti.pk, ti.attempt_token, [{"op": "delete", "key": "a"}])  # finished: too late
    assert list(TaskStateEntry.objects.values_list("key", "value")) == [("a", 2)]


def test_applying_the_same_changes_twice_leaves_the_same_store():
    """A spooled delivery retried after a lost answer is harmless; the decision counts once."""
    run = make_run(chain_dag("etl"))
    ti = start(run, "extract")
    changes = [{"op": "set", "key": "a", "value": 1}, {"op": "delete", "key": "a"}, {"op": "set", "key": "b", "value": 2},
               {"op": "resume", "key": "", "value": "reattached"}]
    assert task_state_store.apply(ti.pk, ti.attempt_token, changes)
    assert task_state_store.apply(ti.pk, ti.attempt_token, changes)
    assert list(TaskStateEntry.objects.values_list("key", "value")) == [("b", 2)]
    assert ti.attempts.get(attempt_token=ti.attempt_token).resume == "reattached"


def test_a_new_key_past_the_limit_is_refused_and_nothing_of_the_changes_is_stored(settings):
    settings.ORCHESTRATOR_TASK_STATE_MAX_KEYS = 2
    run = make_run(chain_dag("etl"))
    ti = start(run, "extract")
    assert task_state_store.apply(ti.pk, ti.attempt_token, [{"op": "set", "key": "a", "value": 1}, {"op": "set", "key": "b", "value": 2}])
    with pytest.raises(ValueError, match="ORCHESTRATOR_TASK_STATE_MAX_KEYS.*2"):
        task_state_store.apply(ti.pk, ti.attempt_token, [{"op": "set", "key": "a", "value": 9}, {"op": "set", "key": "c", "value": 3}])
    assert list(TaskStateEntry.objects.order_by("key").values_list("key", "value")) == [("a", 1), ("b", 2)]
    # An existing key, or a new one once another is deleted, is within the limit.
    changes = [{"op": "set", "key": "a", "value": 9}, {"op": "delete", "key": "b"}, {"op": "set", "key": "c", "value": 3}]
    assert task_state_store.apply(ti.pk, ti.attempt_token, changes)
    assert list(TaskStateEntry.objects.order_by("key").values_list("key", "value")) == [("a", 9), ("c", 3)]


def test_the_task_side_store_refuses_a_new_key_past_the_limit():
    from orchestrator.foundation.task_state import MemoryTaskState

    state = MemoryTaskState({"a": 1}, max_keys=2)
    state.set("b", 2)
    with pytest.raises(ValueError, match=r"ORCHESTRATOR_TASK_STATE_MAX_KEYS \(2\)"):
        state.set("c", 3)
    state.set("a", 5)
    assert dict(state.items()) == {"a": 5, "b": 2}
    assert MemoryTaskState().max_keys == 1000
