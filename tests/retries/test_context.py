"""ExecutionContext: category, reason, source and metadata, stored and served as plain JSON."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retries.context import ExecutionContext
from retries.states import CATEGORY_OF_REASON, Category, Reason, Source

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


def test_it_derives_the_category_from_the_reason() -> None:
    """Callers name only the reason; the category follows from CATEGORY_OF_REASON."""
    assert ExecutionContext.of(Reason.WORKER_LOST, Source.SCHEDULER).category is Category.INFRASTRUCTURE
    assert ExecutionContext.of(Reason.NONZERO_EXIT, Source.WORKER).category is Category.APPLICATION
    assert ExecutionContext.of(Reason.EXECUTION_TIMEOUT, Source.WORKER).category is Category.TIMEOUT
    assert ExecutionContext.of(Reason.MANUAL_CLEAR, Source.API).category is Category.USER_ACTION


def test_it_gives_every_reason_a_category() -> None:
    """No reason is left out of the table."""
    assert set(CATEGORY_OF_REASON) == set(Reason)


def test_it_accepts_the_stored_lowercase_strings() -> None:
    """Values read back from the database or a pipe are plain strings."""
    context = ExecutionContext.of("queue_lost", "scheduler")
    assert (context.category, context.reason, context.source) == (
        Category.INFRASTRUCTURE,
        Reason.QUEUE_LOST,
        Source.SCHEDULER,
    )


def test_it_serialises_as_the_api_shows_it() -> None:
    """to_dict is the `context` object of the run document."""
    context = ExecutionContext.of(Reason.TASK_EXCEPTION, Source.WORKER, exception_type="ValueError", exit_code=1)
    assert context.to_dict() == {
        "category": "application",
        "reason": "task_exception",
        "source": "worker",
        "metadata": {"exception_type": "ValueError", "exit_code": 1},
    }


def test_it_refuses_an_unknown_reason() -> None:
    """A misspelt reason is an error, not a silently wrong budget."""
    with pytest.raises(ValueError, match="'worker_gone' is not a valid Reason"):
        ExecutionContext.of("worker_gone", Source.SCHEDULER)
    with pytest.raises(ValueError, match="'worker_gone' is not a valid Reason"):
        ExecutionContext.from_dict({"category": "infrastructure", "reason": "worker_gone", "source": "scheduler"})


def test_it_reads_a_context_without_metadata() -> None:
    """Missing or null metadata reads as an empty dict."""
    data = {"category": "timeout", "reason": "execution_timeout", "source": "worker", "metadata": None}
    assert ExecutionContext.from_dict(data).metadata == {}


def test_it_recharges_a_failure_under_another_reason() -> None:
    """with_reason keeps the source and metadata, adds the extra keys and recomputes the category."""
    original = ExecutionContext.of(Reason.PRE_EXECUTION_FAILURE, Source.SCHEDULER, pre_execution_reason="error")
    recharged = original.with_reason(Reason.STARTUP_ERROR, note="excluded")
    assert recharged.category is Category.APPLICATION
    assert recharged.reason is Reason.STARTUP_ERROR
    assert recharged.source is Source.SCHEDULER
    assert recharged.metadata == {"pre_execution_reason": "error", "note": "excluded"}
    assert original.metadata == {"pre_execution_reason": "error"}


def test_it_does_not_share_metadata_with_its_caller() -> None:
    """Changing the dict a context was built from does not change the context."""
    metadata = {"exit_code": 1}
    context = ExecutionContext(Category.APPLICATION, Reason.NONZERO_EXIT, Source.WORKER, metadata)
    copy = ExecutionContext.from_dict(context.to_dict())
    metadata["exit_code"] = 2
    assert copy.metadata == {"exit_code": 1}


@settings(deadline=None, max_examples=150)
@given(
    reason=st.sampled_from(list(Reason)),
    source=st.sampled_from(list(Source)),
    metadata=st.dictionaries(st.text(min_size=1), json_values, max_size=4),
)
def test_it_round_trips_through_json(reason: Reason, source: Source, metadata: dict[str, object]) -> None:
    """from_dict(json(to_dict(c))) == c for every reason, source and JSON metadata."""
    context = ExecutionContext(CATEGORY_OF_REASON[reason], reason, source, metadata)
    assert ExecutionContext.from_dict(json.loads(json.dumps(context.to_dict()))) == context
