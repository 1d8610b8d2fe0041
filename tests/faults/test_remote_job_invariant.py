"""The invariant "no remote job submitted twice for one task instance unless the first failed"
catches what it should, from a job service's ledger."""
from __future__ import annotations

from tests.faults.invariants import remote_job_violations


def _job(id, key, state, submitted_at, ended_at):
    return {"id": id, "key": key, "state": state, "submitted_at": submitted_at, "ended_at": ended_at}


def test_it_accepts_one_job_per_key_and_a_resubmission_after_a_failure():
    assert remote_job_violations([
        _job("a", "k1", "failed", 0, 5),
        _job("b", "k1", "cancelled", 6, 7),
        _job("c", "k1", "succeeded", 8, 9),
        _job("d", "k2", "running", 1, None),
    ]) == []


def test_it_flags_a_second_submit_while_the_first_ran_or_succeeded():
    problems = remote_job_violations([
        _job("a", "k1", "running", 0, None),
        _job("b", "k1", "running", 1, None),
        _job("c", "k2", "succeeded", 0, 2),
        _job("d", "k2", "succeeded", 3, 5),
    ])
    assert len(problems) == 2
    assert "job b" in problems[0]
    assert "job d" in problems[1]


def test_it_flags_a_submit_before_the_first_had_failed():
    """A job that failed later does not excuse a submit made while it still ran."""
    assert len(remote_job_violations([_job("a", "k", "failed", 0, 10), _job("b", "k", "succeeded", 5, 12)])) == 1
