"""The memory rules on their own: the next attempt's limit and queue, the poison streak, and how
the worker names what it saw."""
from __future__ import annotations

import random
import signal
from datetime import datetime, timezone

from orchestrator.worker.classify import Outcome, classify
from orchestrator.worker.final import BashExited
from retries.context import ExecutionContext
from retries.memory import MemoryArgs, after_failure, next_limit, steps_problem, together_problem
from retries.policy import Budget, PlatformSettings, RetryArgs, decide
from retries.states import Reason, Source, TaskState

NOW = datetime(2026, 11, 1, tzinfo=timezone.utc)
STEPS = MemoryArgs(memory_limit=2048, memory_limit_on_retry=(4096, 8192), queue_on_oom="big")


def test_each_step_takes_the_next_limit_and_the_last_repeats():
    assert next_limit(2048, STEPS) == 4096
    assert next_limit(4096, STEPS) == 8192
    assert next_limit(8192, STEPS) == 8192
    assert next_limit(2048, MemoryArgs(memory_limit=2048)) == 2048  # no list: the limit stays
    assert next_limit(None, STEPS) is None


def test_only_memory_limit_exceeded_changes_the_limit_and_the_queue():
    stepped = after_failure(Reason.MEMORY_LIMIT_EXCEEDED, 2048, "default", STEPS)
    assert (stepped.memory_limit_mib, stepped.queue) == (4096, "big")
    for reason in (Reason.TASK_EXCEPTION, Reason.RESOURCE_EXHAUSTION, Reason.EXECUTION_TIMEOUT):
        kept = after_failure(reason, 4096, "big", STEPS)
        assert (kept.memory_limit_mib, kept.queue) == (4096, "big")
    no_queue = after_failure(Reason.MEMORY_LIMIT_EXCEEDED, 2048, "default", MemoryArgs(2048, (4096,)))
    assert no_queue.queue == "default"


def test_the_list_must_grow_and_start_above_the_limit():
    assert steps_problem([4096, 8192]) is None
    assert "grow strictly" in (steps_problem([4096, 4096]) or "")
    assert ">= 16" in (steps_problem([8]) or "")
    assert "needs memory_limit" in (together_problem(None, [4096]) or "")
    assert "start above" in (together_problem(4096, [4096]) or "")
    assert together_problem(2048, []) is None


def _decide(reason: Reason, budget: Budget, fingerprint: str | None):
    args = RetryArgs(retry_delay=1, retry_backoff="fixed", retry_max_delay=10, retry_jitter="none", infrastructure_retry_limit=5, poison_threshold=2)
    platform = PlatformSettings(infrastructure_retry_delay=1, pre_execution_retries=1, pre_execution_excluded_reasons=frozenset())
    context = ExecutionContext.of(reason, Source.WORKER)
    return decide(context, budget, args, platform, now=NOW, rng=random.Random(0), fingerprint=fingerprint)


def test_memory_limit_exceeded_never_counts_towards_poison_threshold():
    budget = Budget(try_number=1, max_tries=5, infrastructure_try_number=0, pre_execution_tries=0, last_fingerprint="abc", fingerprint_streak=1)
    decision = _decide(Reason.MEMORY_LIMIT_EXCEEDED, budget, "abc")
    assert decision.next_state is TaskState.UP_FOR_RETRY
    assert decision.attempt_fingerprint is None
    assert decision.kind == "user"


def _outcome(**changes) -> Outcome:
    return Outcome(handshake=True, metadata={"worker_name": "w"}, **changes)


def test_past_its_limit_is_memory_limit_exceeded_whatever_the_exit():
    for returncode, final in ((-signal.SIGKILL, None), (0, BashExited(0)), (1, None)):
        verdict = classify(_outcome(returncode=returncode, final=final, memory_limit_mib=64, memory_enforced_by="cgroup", peak_memory_mib=64, memory_exceeded=True))
        context = verdict.context
        assert context is not None
        assert context.reason is Reason.MEMORY_LIMIT_EXCEEDED
        assert {k: context.metadata[k] for k in ("memory_limit_mib", "peak_mib", "enforced_by")} == {"memory_limit_mib": 64, "peak_mib": 64, "enforced_by": "cgroup"}
        assert verdict.fingerprint is None


def test_a_kernel_oom_under_its_own_limit_is_the_hosts():
    cgroup = classify(_outcome(returncode=-signal.SIGKILL, memory_limit_mib=512, memory_enforced_by="cgroup", killed_by_host_oom=True))
    assert cgroup.context is not None
    assert cgroup.context.reason is Reason.RESOURCE_EXHAUSTION
    assert cgroup.context.metadata["oom"] == "host"
    # With a cgroup its own counters decide: the machine's OOM kills elsewhere do not.
    outside = classify(_outcome(returncode=-signal.SIGKILL, memory_limit_mib=512, memory_enforced_by="cgroup", machine_oom_kills_before=3, machine_oom_kills_after=4))
    assert outside.context is not None
    assert "oom" not in outside.context.metadata
    unlimited = classify(_outcome(returncode=-signal.SIGKILL, machine_oom_kills_before=3, machine_oom_kills_after=4))
    assert unlimited.context is not None
    assert unlimited.context.metadata["oom"] == "host"
    killed = classify(_outcome(returncode=-signal.SIGKILL, machine_oom_kills_before=3, machine_oom_kills_after=3))
    assert killed.context is not None
    assert killed.context.reason is Reason.RESOURCE_EXHAUSTION
    assert "oom" not in killed.context.metadata
