"""RemoteJob's decisions and the task state's rules, without a worker (MemoryTaskState)."""
from __future__ import annotations

import pytest

from orchestrator.foundation.task_state import MemoryTaskState, validated
from orchestrator.resumable import JOB_ID_KEY, RemoteJob, RemoteJobFailed
from retries.context import ExecutionContext
from retries.states import Reason, Source


class FakeService(RemoteJob):
    poll_interval = 0

    def __init__(self, states: dict[str, list[str]], found: str | None = None) -> None:
        self.states = states  # job id -> the statuses it reports, one per call (the last repeats)
        self.found = found
        self.calls: list[tuple[str, str]] = []

    def submit(self, key):
        job_id = f"job{len(self.states)}"
        self.states[job_id] = ["running", "succeeded"]
        self.calls.append(("submit", key))
        return job_id

    def status(self, job_id):
        statuses = self.states[job_id]
        return statuses.pop(0) if len(statuses) > 1 else statuses[0]

    def result(self, job_id):
        return {"from": job_id}

    def cancel(self, job_id):
        self.calls.append(("cancel", job_id))

    def find(self, key):
        self.calls.append(("find", key))
        return self.found


def _run(job, entries=None):
    state = MemoryTaskState(entries)
    return job.execute({"task_state": state, "idempotency_key": "K"}), state


@pytest.mark.parametrize(
    ("entries", "states", "found", "decision", "submits"),
    [
        ({}, {}, None, "submitted", 1),
        ({JOB_ID_KEY: "old"}, {"old": ["running", "succeeded"]}, None, "reattached", 0),
        ({JOB_ID_KEY: "old"}, {"old": ["succeeded"]}, None, "already_succeeded", 0),
        ({JOB_ID_KEY: "old"}, {"old": ["failed"]}, None, "resubmitted", 1),
        ({}, {"lost": ["running", "succeeded"]}, "lost", "reattached", 0),
    ],
)
def test_it_decides_from_what_it_finds(entries, states, found, decision, submits):
    job = FakeService(states, found=found)
    result, state = _run(job, entries)
    assert state.decisions == [decision]
    assert [c for c in job.calls if c[0] == "submit"] == [("submit", "K")] * submits
    assert result == {"from": state.get(JOB_ID_KEY)}


def test_a_job_found_by_its_key_is_stored_for_the_next_attempt():
    _, state = _run(FakeService({"lost": ["running", "succeeded"]}, found="lost"))
    assert state.get(JOB_ID_KEY) == "lost"


def test_a_failed_job_fails_the_attempt():
    job = FakeService({"old": ["running", "failed"]})
    with pytest.raises(RemoteJobFailed):
        _run(job, {JOB_ID_KEY: "old"})


def test_a_status_it_does_not_know_is_an_error_naming_it():
    with pytest.raises(ValueError, match="'weird'"):
        _run(FakeService({"old": ["weird"]}), {JOB_ID_KEY: "old"})


@pytest.mark.parametrize(
    ("reason", "cancels"),
    [(Reason.WORKER_LOST, False), (Reason.WORKER_TERMINATION, False), (Reason.EXECUTION_TIMEOUT, True), (Reason.MANUAL_MARK_FAILED, True)],
)
def test_on_kill_cancels_only_for_timeouts_and_operators(reason, cancels, capsys):
    job = FakeService({})
    job._job_id = "j"
    job.on_kill(ExecutionContext.of(reason, Source.WORKER))
    assert (("cancel", "j") in job.calls) is cancels
    assert ("cancelling" if cancels else "leaving remote job j running") in capsys.readouterr().err


@pytest.mark.parametrize(
    ("key", "value"),
    [("k", "x" * 70000), ("k", {1}), ("k", float("inf")), ("k", "\x00"), ("k", {"a": ["\x00"]}), ("k", "\udc80"), ("", 1), (1, 1), ("k" * 251, 1)],
)
def test_it_refuses_what_cannot_be_stored(key, value):
    state = MemoryTaskState({"kept": 1})
    with pytest.raises(ValueError, match="^task state: "):
        state.set(key, value)
    assert list(state.items()) == [("kept", 1)]


def test_the_limit_is_the_encoded_size():
    assert validated("set", "k", "é" * 10, max_bytes=22) == ("k", "é" * 10)  # 20 bytes + 2 quotes
    with pytest.raises(ValueError, match="23 bytes"):
        validated("set", "k", "é" * 10 + "a", max_bytes=22)
    assert validated("set", "k", "a\\u0000b")[1] == "a\\u0000b"  # the text, not a NUL
