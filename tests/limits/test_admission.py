"""Admission rules (retries.admission): limits never exceeded, best-ranked first, nobody overtakes in a pool."""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from retries.admission import Candidate, Usage, admit, ranked
from retries.states import WaitKind

T0 = datetime(2026, 11, 21, tzinfo=timezone.utc)
FAST = settings(deadline=None, max_examples=200)

# Every instance of one task shares its max_active_tis_per_dag, as the engine reads it.
TASK_LIMIT = {"x": 1, "y": 2, "z": None}
candidates = st.lists(
    st.builds(
        Candidate,
        key=st.integers(1, 10_000),
        dag_id=st.sampled_from(["a", "b"]),
        task_id=st.sampled_from(sorted(TASK_LIMIT)),
        run_order=st.integers(0, 5).map(lambda d: T0 + timedelta(days=d)),
        priority_weight=st.integers(-2, 5),
        pool=st.sampled_from([None, "p", "q"]),
        pool_slots=st.integers(1, 3),
    ).map(lambda c: replace(c, max_active_tis_per_dag=TASK_LIMIT[c.task_id])),
    max_size=30,
    unique_by=lambda c: c.key,
)
usages = st.builds(
    Usage,
    pool_slots=st.fixed_dictionaries({"p": st.integers(0, 6), "q": st.integers(0, 6)}),
    pool_used=st.fixed_dictionaries({"p": st.integers(0, 3), "q": st.integers(0, 3)}),
    dag_limit=st.fixed_dictionaries({"a": st.sampled_from([None, 1, 3]), "b": st.sampled_from([None, 2])}),
    dag_active=st.fixed_dictionaries({"a": st.integers(0, 2), "b": st.integers(0, 2)}),
)


@FAST
@given(candidates, usages)
def test_admitted_tasks_never_exceed_a_limit(cands, usage):
    admitted, held = admit(cands, usage)
    by_key = {c.key: c for c in cands}
    assert set(admitted) | set(held) == set(by_key)
    assert not set(admitted) & set(held)
    chosen = [by_key[k] for k in admitted]
    for pool in ("p", "q"):
        taken = sum(c.pool_slots for c in chosen if c.pool == pool)
        assert taken == 0 or usage.pool_used[pool] + taken <= usage.pool_slots[pool]
    for dag_id, limit in usage.dag_limit.items():
        count = sum(1 for c in chosen if c.dag_id == dag_id)
        assert limit is None or count == 0 or usage.dag_active[dag_id] + count <= limit
    for c in chosen:
        if c.max_active_tis_per_dag is not None:
            same = [o for o in chosen if (o.dag_id, o.task_id) == (c.dag_id, c.task_id)]
            assert len(same) <= c.max_active_tis_per_dag


@FAST
@given(candidates, usages)
def test_within_a_pool_nobody_overtakes_a_waiting_task(cands, usage):
    admitted, held = admit(cands, usage)
    for pool in ("p", "q"):
        order = [c.key for c in ranked(cands) if c.pool == pool]
        first_waiting = next((i for i, k in enumerate(order) if k in held and held[k].kind is WaitKind.POOL), None)
        if first_waiting is not None:
            assert not set(order[first_waiting:]) & set(admitted)


def test_priority_weight_then_the_older_run_gets_the_slot():
    old_run, new_run = T0, T0 + timedelta(hours=1)
    backfill = Candidate(1, "a", "x", old_run, priority_weight=1, pool="p")
    today = Candidate(2, "a", "x", new_run, priority_weight=5, pool="p")
    same_weight_newer = Candidate(3, "a", "y", new_run, priority_weight=1, pool="p")
    admitted, held = admit([same_weight_newer, backfill, today], Usage(pool_slots={"p": 2}))
    assert admitted == [2, 1]
    assert held[3].kind is WaitKind.POOL
    assert held[3].name == "p"


def test_a_limit_names_what_holds_the_task():
    usage = Usage(pool_slots={"p": 5}, dag_limit={"a": 1}, dag_active={"a": 1})
    _, held = admit([Candidate(1, "a", "x", T0, pool="p")], usage)
    assert (held[1].kind, held[1].name) == (WaitKind.MAX_ACTIVE_TASKS, "a")
    _, held = admit([Candidate(1, "a", "x", T0, max_active_tis_per_dag=1)], Usage(task_active={("a", "x"): 1}))
    assert (held[1].kind, held[1].name) == (WaitKind.MAX_ACTIVE_TIS_PER_DAG, "x")
    _, held = admit([Candidate(1, "a", "x", T0, pool="gone")], Usage())
    assert (held[1].kind, held[1].name) == (WaitKind.POOL, "gone")
