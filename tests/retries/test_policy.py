"""The decision table: which budget a failed attempt charges and where the task goes next."""
from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.data import taskconfig
from retries.backoff import ceiling
from retries.context import ExecutionContext
from retries.policy import Budget, Decision, PlatformSettings, RetryArgs, decide
from retries.states import (
    CATEGORY_OF_REASON,
    AttemptKind,
    Category,
    PreExecutionReason,
    Reason,
    Source,
    TaskState,
)

NOW = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
FP_A = "4a7c1d9e02bb"
FP_B = "0123456789ab"
# The system defaults (retry_delay 2 s, exponential, cap 600 s, full jitter, platform limit 5) with poisoning on.
ARGS = replace(taskconfig.retry_args(taskconfig.system_defaults()), poison_threshold=2)
PLATFORM = taskconfig.platform_settings()  # platform retry after 10 s, 1 pre-execution retry per user try, "error" excluded
FAST = settings(deadline=None, max_examples=150)

INFRASTRUCTURE_REASONS = [r for r in Reason if CATEGORY_OF_REASON[r] is Category.INFRASTRUCTURE]
# Reasons a worker or scheduler reports for a failed attempt (poisoned is only ever an outcome).
FAILURE_REASONS = [
    *INFRASTRUCTURE_REASONS,
    Reason.TASK_EXCEPTION,
    Reason.NONZERO_EXIT,
    Reason.NON_RETRYABLE,
    Reason.STARTUP_ERROR,
    Reason.EXECUTION_TIMEOUT,
]
FINGERPRINTED_REASONS = {Reason.TASK_EXCEPTION, Reason.NONZERO_EXIT, Reason.NON_RETRYABLE}
PRE_EXECUTION_KINDS = [kind.value for kind in PreExecutionReason]


def failure(reason: Reason, source: Source = Source.WORKER, **metadata: object) -> ExecutionContext:
    return ExecutionContext.of(reason, source, **metadata)


def pre_execution(kind: str) -> ExecutionContext:
    return failure(Reason.PRE_EXECUTION_FAILURE, Source.SCHEDULER, pre_execution_reason=kind, exit_code=1)


def budget(try_number: int = 1, max_tries: int = 4, infrastructure_try_number: int = 0, **extra: object) -> Budget:
    return Budget(try_number=try_number, max_tries=max_tries, infrastructure_try_number=infrastructure_try_number, **extra)


def run(
    context: ExecutionContext,
    counters: Budget,
    args: RetryArgs = ARGS,
    platform: PlatformSettings = PLATFORM,
    *,
    fingerprint: str | None = None,
    retry_after: float | None = None,
    seed: int = 0,
) -> Decision:
    return decide(
        context,
        counters,
        args,
        platform,
        now=NOW,
        rng=random.Random(seed),
        fingerprint=fingerprint,
        retry_after=retry_after,
    )


def after(counters: Budget, decision: Decision) -> Budget:
    """The counters of the next dispatch, as the engine stores them: a user retry adds one try."""
    return replace(
        counters,
        try_number=counters.try_number + (0 if decision.is_platform_retry else 1),
        infrastructure_try_number=decision.infrastructure_try_number,
        pre_execution_tries=decision.pre_execution_tries,
        last_fingerprint=decision.fingerprint,
        fingerprint_streak=decision.fingerprint_streak,
    )


def seconds_after_now(moment: datetime | None) -> float:
    assert moment is not None
    return (moment - NOW).total_seconds()


# --- the platform budget -------------------------------------------------------------------


@pytest.mark.parametrize("reason", [r for r in INFRASTRUCTURE_REASONS if r is not Reason.PRE_EXECUTION_FAILURE])
def test_it_retries_an_infrastructure_failure_on_the_platform_budget(reason: Reason) -> None:
    """Back to `scheduled` after the platform delay, one more platform try, the user budget untouched."""
    context = failure(reason, Source.SCHEDULER)
    decision = run(context, budget(try_number=2, infrastructure_try_number=1))
    assert decision.next_state is TaskState.SCHEDULED
    assert decision.kind is AttemptKind.PLATFORM
    assert decision.is_platform_retry
    assert decision.infrastructure_try_number == 2
    assert decision.next_retry_at == NOW + timedelta(seconds=10)
    assert decision.attempt_context == context
    assert decision.task_context == context


def test_it_waits_the_configured_platform_delay() -> None:
    """ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY decides when a platform retry is dispatched."""
    for seconds in (0.0, 42.5):
        decision = run(failure(Reason.WORKER_LOST), budget(), platform=replace(PLATFORM, infrastructure_retry_delay=seconds))
        assert decision.next_retry_at == NOW + timedelta(seconds=seconds)


def test_it_keeps_the_try_number_across_platform_retries() -> None:
    """Five node drains in a row still leave the task on its first user try."""
    counters = budget(try_number=1, max_tries=1)
    for expected in range(1, 6):
        decision = run(failure(Reason.WORKER_TERMINATION), counters)
        assert decision.kind is AttemptKind.PLATFORM
        assert decision.infrastructure_try_number == expected
        counters = after(counters, decision)
        assert counters.try_number == 1


def test_it_falls_through_to_the_user_budget_when_the_platform_budget_is_spent() -> None:
    """Platform budget spent: the user pays, and the context still says it was the infrastructure."""
    context = failure(Reason.WORKER_LOST, Source.SCHEDULER)
    decision = run(context, budget(try_number=1, max_tries=4, infrastructure_try_number=5))
    assert decision.kind is AttemptKind.USER
    assert decision.next_state is TaskState.UP_FOR_RETRY
    assert decision.infrastructure_try_number == 5
    assert decision.attempt_context == context
    assert decision.task_context == context
    assert decision.task_context.category is Category.INFRASTRUCTURE
    assert 0 <= seconds_after_now(decision.next_retry_at) <= 2.0


def test_it_fails_an_infrastructure_failure_when_both_budgets_are_spent() -> None:
    """No platform and no user retries left: `failed`, with the infrastructure context kept."""
    context = failure(Reason.RESOURCE_EXHAUSTION, exit_signal=9)
    decision = run(context, budget(try_number=4, max_tries=4, infrastructure_try_number=5))
    assert decision.next_state is TaskState.FAILED
    assert decision.kind is AttemptKind.USER
    assert decision.task_context == context
    assert decision.next_retry_at is None


def test_it_never_retries_on_the_platform_with_a_zero_limit() -> None:
    """infrastructure_retry_limit 0: every infrastructure failure charges the user."""
    decision = run(failure(Reason.QUEUE_LOST), budget(), replace(ARGS, infrastructure_retry_limit=0))
    assert decision.kind is AttemptKind.USER
    assert decision.infrastructure_try_number == 0


def test_it_treats_a_platform_try_number_above_the_limit_as_spent() -> None:
    """A limit lowered by a re-import below the tries already spent does not go negative."""
    decision = run(failure(Reason.WORKER_LOST), budget(infrastructure_try_number=7))
    assert decision.kind is AttemptKind.USER
    assert decision.infrastructure_try_number == 7


def test_it_keeps_the_poison_streak_on_a_platform_retry() -> None:
    """A platform attempt is not a user attempt: the fingerprint and its streak carry over."""
    counters = budget(last_fingerprint=FP_A, fingerprint_streak=1)
    decision = run(failure(Reason.WORKER_LOST), counters, fingerprint=FP_B)
    assert decision.fingerprint == FP_A
    assert decision.fingerprint_streak == 1


# --- pre-execution failures ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["killed", "start_error", "worker_died"])
def test_it_retries_a_pre_execution_failure_once_on_the_platform(kind: str) -> None:
    """A task that never started is retried as infrastructure/pre_execution_failure."""
    context = pre_execution(kind)
    decision = run(context, budget())
    assert decision.kind is AttemptKind.PLATFORM
    assert decision.next_state is TaskState.SCHEDULED
    assert decision.pre_execution_tries == 1
    assert decision.infrastructure_try_number == 1
    assert decision.task_context == context


def test_it_charges_the_user_once_the_pre_execution_allowance_is_spent() -> None:
    """The second pre-execution failure in one user try is an application/startup_error."""
    decision = run(pre_execution("worker_died"), budget(pre_execution_tries=1, infrastructure_try_number=1))
    assert decision.kind is AttemptKind.USER
    assert decision.next_state is TaskState.UP_FOR_RETRY
    assert decision.infrastructure_try_number == 1
    assert decision.task_context.category is Category.APPLICATION
    assert decision.task_context.reason is Reason.STARTUP_ERROR
    assert decision.task_context.source is Source.SCHEDULER
    assert decision.task_context.metadata == {"pre_execution_reason": "worker_died", "exit_code": 1}
    assert decision.attempt_context == decision.task_context


def test_it_gives_each_user_try_its_own_pre_execution_allowance() -> None:
    """At most `pre_execution_retries` platform retries per user try, counted afresh each try."""
    platform = replace(PLATFORM, pre_execution_retries=2)
    counters = budget(try_number=1, max_tries=3)
    kinds: list[tuple[int, AttemptKind]] = []
    for _ in range(9):
        decision = run(pre_execution("killed"), counters, replace(ARGS, infrastructure_retry_limit=100), platform)
        kinds.append((counters.try_number, decision.kind))
        if decision.next_state in (TaskState.FAILED, TaskState.DEAD_LETTER):
            break
        counters = after(counters, decision)
    platform_kind, user_kind = AttemptKind.PLATFORM, AttemptKind.USER
    assert kinds == [
        (1, platform_kind), (1, platform_kind), (1, user_kind),
        (2, platform_kind), (2, platform_kind), (2, user_kind),
        (3, platform_kind), (3, platform_kind), (3, user_kind),
    ]  # fmt: skip
    assert decision.next_state is TaskState.FAILED
    assert decision.task_context.reason is Reason.STARTUP_ERROR


def test_it_charges_an_excluded_pre_execution_kind_to_the_user_at_once() -> None:
    """The default excluded kind `error` (the task exited by itself) is the task's own doing."""
    decision = run(pre_execution("error"), budget())
    assert decision.kind is AttemptKind.USER
    assert decision.pre_execution_tries == 0
    assert decision.infrastructure_try_number == 0
    assert decision.task_context.reason is Reason.STARTUP_ERROR
    assert decision.task_context.category is Category.APPLICATION
    assert decision.task_context.metadata["pre_execution_reason"] == "error"


def test_it_retries_every_pre_execution_kind_when_none_is_excluded() -> None:
    """An empty ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS excludes nothing, not even `error`."""
    decision = run(pre_execution("error"), budget(), platform=replace(PLATFORM, pre_execution_excluded_reasons=frozenset()))
    assert decision.kind is AttemptKind.PLATFORM


def test_it_honours_a_custom_excluded_list() -> None:
    """Excluded kinds go to the user; the others stay on the platform."""
    platform = replace(PLATFORM, pre_execution_excluded_reasons=frozenset({"killed", "start_error"}))
    assert run(pre_execution("killed"), budget(), platform=platform).kind is AttemptKind.USER
    assert run(pre_execution("start_error"), budget(), platform=platform).kind is AttemptKind.USER
    assert run(pre_execution("error"), budget(), platform=platform).kind is AttemptKind.PLATFORM
    assert run(pre_execution("worker_died"), budget(), platform=platform).kind is AttemptKind.PLATFORM


def test_it_reads_the_pre_execution_kind_case_insensitively() -> None:
    """`ERROR` in the metadata is the excluded kind `error`; the enum value works too."""
    assert run(pre_execution("ERROR"), budget()).kind is AttemptKind.USER
    assert run(pre_execution(PreExecutionReason.ERROR), budget()).kind is AttemptKind.USER


def test_it_never_retries_a_pre_execution_failure_on_the_platform_with_zero_retries() -> None:
    """ORCHESTRATOR_PRE_EXECUTION_RETRIES=0: every pre-execution failure is a startup error."""
    decision = run(pre_execution("worker_died"), budget(), platform=replace(PLATFORM, pre_execution_retries=0))
    assert decision.kind is AttemptKind.USER
    assert decision.task_context.reason is Reason.STARTUP_ERROR


def test_it_charges_a_pre_execution_failure_to_the_user_when_the_platform_budget_is_spent() -> None:
    """A pre-execution retry spends the platform budget too; with none left the user pays a startup error."""
    decision = run(pre_execution("worker_died"), budget(infrastructure_try_number=5))
    assert decision.kind is AttemptKind.USER
    assert decision.infrastructure_try_number == 5
    assert decision.task_context.reason is Reason.STARTUP_ERROR


def test_it_retries_a_pre_execution_failure_without_a_kind_on_the_platform() -> None:
    """A pre-execution failure whose kind is unknown is not in any excluded list."""
    decision = run(failure(Reason.PRE_EXECUTION_FAILURE, Source.SCHEDULER), budget())
    assert decision.kind is AttemptKind.PLATFORM


# --- the user budget -----------------------------------------------------------------------


def test_it_schedules_a_user_retry_within_the_backoff_window() -> None:
    """try 3 of 4 with retry_delay 2 s and full jitter: next_retry_at within [now, now + 8 s]."""
    decision = run(failure(Reason.TASK_EXCEPTION), budget(try_number=3, max_tries=4), fingerprint=FP_A)
    assert decision.next_state is TaskState.UP_FOR_RETRY
    assert decision.kind is AttemptKind.USER
    assert 0 <= seconds_after_now(decision.next_retry_at) <= 8.0
    assert decision.task_context.reason is Reason.TASK_EXCEPTION
    assert decision.fingerprint == FP_A


def test_it_uses_the_tasks_backoff_settings() -> None:
    """retry_delay, retry_max_delay and jitter come from the task's effective args."""
    args = replace(ARGS, retry_delay=5.0, retry_max_delay=30.0, retry_jitter="none")
    waits = [seconds_after_now(run(failure(Reason.NONZERO_EXIT), budget(n, 10), args).next_retry_at) for n in range(1, 6)]
    assert waits == [5.0, 10.0, 20.0, 30.0, 30.0]


def test_it_fails_when_the_last_user_try_fails() -> None:
    """try_number == max_tries: `failed`, no next retry."""
    decision = run(failure(Reason.TASK_EXCEPTION), budget(try_number=4, max_tries=4), fingerprint=FP_A)
    assert decision.next_state is TaskState.FAILED
    assert decision.kind is AttemptKind.USER
    assert decision.next_retry_at is None


def test_it_fails_a_non_retryable_error_at_once() -> None:
    """NonRetryableError fails the task even with nine tries left, and even if it looks poisoned."""
    context = failure(Reason.NON_RETRYABLE, exception_type="NonRetryableError")
    decision = run(context, budget(try_number=1, max_tries=10, last_fingerprint=FP_A, fingerprint_streak=5), fingerprint=FP_A)
    assert decision.next_state is TaskState.FAILED
    assert decision.kind is AttemptKind.USER
    assert decision.task_context == context
    assert decision.next_retry_at is None


def test_it_retries_exactly_after_the_requested_delay() -> None:
    """RetryAfter(37.5): next_retry_at is now + 37.5 s, not a backoff draw, and not capped."""
    decision = run(failure(Reason.TASK_EXCEPTION), budget(try_number=1), retry_after=37.5)
    assert decision.next_state is TaskState.UP_FOR_RETRY
    assert decision.next_retry_at == NOW + timedelta(seconds=37.5)
    long_wait = run(failure(Reason.TASK_EXCEPTION), budget(try_number=1), retry_after=3600)
    assert long_wait.next_retry_at == NOW + timedelta(seconds=3600)


def test_it_still_charges_the_user_budget_for_a_retry_after() -> None:
    """RetryAfter on the last try fails the task."""
    decision = run(failure(Reason.TASK_EXCEPTION), budget(try_number=4, max_tries=4), retry_after=5)
    assert decision.next_state is TaskState.FAILED
    assert decision.next_retry_at is None


def test_it_never_schedules_a_retry_after_in_the_past() -> None:
    """A negative Retry-After means now."""
    decision = run(failure(Reason.TASK_EXCEPTION), budget(), retry_after=-3)
    assert decision.next_retry_at == NOW


def test_it_charges_a_timeout_to_the_user_budget() -> None:
    """execution_timeout is the task's doing: user budget, even with the platform budget untouched."""
    context = failure(Reason.EXECUTION_TIMEOUT, timeout=30)
    retried = run(context, budget(try_number=1, max_tries=2))
    assert retried.kind is AttemptKind.USER
    assert retried.next_state is TaskState.UP_FOR_RETRY
    assert retried.infrastructure_try_number == 0
    assert retried.task_context == context
    assert retried.task_context.category is Category.TIMEOUT
    failed = run(context, budget(try_number=2, max_tries=2))
    assert failed.next_state is TaskState.FAILED


def test_it_resets_the_pre_execution_allowance_on_a_user_charge() -> None:
    """A user charge ends the user try, so the next try starts with no pre-execution retries spent."""
    decision = run(failure(Reason.TASK_EXCEPTION), budget(pre_execution_tries=1), fingerprint=FP_A)
    assert decision.pre_execution_tries == 0


def test_it_spreads_twenty_simultaneous_retries_over_the_window() -> None:
    """20 tasks failing at the same instant (exp = 60 s, full jitter) retry in many different seconds."""
    rng = random.Random(7)
    args = replace(ARGS, retry_delay=60.0)
    moments = [
        decide(failure(Reason.TASK_EXCEPTION), budget(), args, PLATFORM, now=NOW, rng=rng).next_retry_at
        for _ in range(20)
    ]
    seconds = {int(seconds_after_now(m)) for m in moments}
    assert all(0 <= seconds_after_now(m) <= 60 for m in moments)
    assert len(seconds) >= 14


# --- poisoned tasks ------------------------------------------------------------------------


def test_it_dead_letters_a_task_that_fails_the_same_way_twice() -> None:
    """poison_threshold 2: the second consecutive failure with the same fingerprint dead-letters."""
    context = failure(Reason.TASK_EXCEPTION, exception_type="ZeroDivisionError")
    first = run(context, budget(try_number=1, max_tries=4), fingerprint=FP_A)
    assert first.next_state is TaskState.UP_FOR_RETRY
    assert (first.fingerprint, first.fingerprint_streak) == (FP_A, 1)

    second = run(context, after(budget(try_number=1, max_tries=4), first), fingerprint=FP_A)
    assert second.next_state is TaskState.DEAD_LETTER
    assert second.kind is AttemptKind.USER
    assert second.next_retry_at is None
    assert second.attempt_context == context
    assert second.task_context.category is Category.APPLICATION
    assert second.task_context.reason is Reason.POISONED
    assert second.task_context.source is Source.WORKER
    assert second.task_context.metadata == {
        "exception_type": "ZeroDivisionError",
        "original_reason": "task_exception",
        "fingerprint": FP_A,
        "consecutive_failures": 2,
    }
    assert (second.fingerprint, second.fingerprint_streak) == (FP_A, 2)


def test_it_dead_letters_a_bash_task_that_exits_the_same_way_twice() -> None:
    """nonzero_exit failures have fingerprints too."""
    counters = budget(last_fingerprint=FP_B, fingerprint_streak=1)
    decision = run(failure(Reason.NONZERO_EXIT, exit_code=2), counters, fingerprint=FP_B)
    assert decision.next_state is TaskState.DEAD_LETTER
    assert decision.task_context.metadata["original_reason"] == "nonzero_exit"


def test_it_never_dead_letters_with_a_zero_threshold() -> None:
    """poison_threshold 0: the same failure ten times just spends the user budget."""
    args = replace(ARGS, poison_threshold=0)
    counters = budget(try_number=1, max_tries=10)
    for _ in range(10):
        decision = run(failure(Reason.TASK_EXCEPTION), counters, args, fingerprint=FP_A)
        assert decision.next_state is not TaskState.DEAD_LETTER
        counters = after(counters, decision)
    assert decision.next_state is TaskState.FAILED
    assert decision.fingerprint_streak == 10


def test_it_dead_letters_on_the_first_failure_with_a_threshold_of_one() -> None:
    """poison_threshold 1: one failure with a fingerprint is enough."""
    decision = run(failure(Reason.TASK_EXCEPTION), budget(), replace(ARGS, poison_threshold=1), fingerprint=FP_A)
    assert decision.next_state is TaskState.DEAD_LETTER


def test_it_counts_up_to_a_higher_threshold() -> None:
    """poison_threshold 3: retry, retry, dead-letter."""
    args = replace(ARGS, poison_threshold=3)
    counters = budget(try_number=1, max_tries=10)
    states = []
    for _ in range(3):
        decision = run(failure(Reason.TASK_EXCEPTION), counters, args, fingerprint=FP_A)
        states.append(decision.next_state)
        counters = after(counters, decision)
    assert states == [TaskState.UP_FOR_RETRY, TaskState.UP_FOR_RETRY, TaskState.DEAD_LETTER]


def test_it_restarts_the_streak_on_a_different_fingerprint() -> None:
    """A, B, A, B: never two the same in a row, so never poisoned."""
    counters = budget(try_number=1, max_tries=10)
    for fingerprint in (FP_A, FP_B, FP_A, FP_B):
        decision = run(failure(Reason.TASK_EXCEPTION), counters, fingerprint=fingerprint)
        assert decision.next_state is TaskState.UP_FOR_RETRY
        assert (decision.fingerprint, decision.fingerprint_streak) == (fingerprint, 1)
        counters = after(counters, decision)


def test_it_keeps_the_streak_through_a_platform_failure_in_between() -> None:
    """A, worker lost, A: the platform attempt does not break the streak, so the task is poisoned."""
    counters = budget(try_number=1, max_tries=10)
    tries = []
    for context, fingerprint in (
        (failure(Reason.TASK_EXCEPTION), FP_A),
        (failure(Reason.WORKER_LOST, Source.SCHEDULER), None),
        (failure(Reason.TASK_EXCEPTION), FP_A),
    ):
        tries.append(counters.try_number)
        decision = run(context, counters, fingerprint=fingerprint)
        counters = after(counters, decision)
    assert decision.next_state is TaskState.DEAD_LETTER
    assert tries == [1, 2, 2]  # the platform retry repeated user try 2


def test_it_breaks_the_streak_on_a_timeout_in_between() -> None:
    """A, timeout, A: the user attempts in a row did not all fail the same way."""
    counters = budget(try_number=1, max_tries=10)
    for context, fingerprint in (
        (failure(Reason.TASK_EXCEPTION), FP_A),
        (failure(Reason.EXECUTION_TIMEOUT), None),
        (failure(Reason.TASK_EXCEPTION), FP_A),
    ):
        decision = run(context, counters, fingerprint=fingerprint)
        counters = after(counters, decision)
    assert decision.next_state is TaskState.UP_FOR_RETRY
    assert decision.fingerprint_streak == 1


def test_it_ignores_a_fingerprint_on_a_failure_that_is_not_an_application_failure() -> None:
    """Only application failures have fingerprints: a timeout passed one cannot poison the task."""
    counters = budget(last_fingerprint=FP_A, fingerprint_streak=1)
    decision = run(failure(Reason.EXECUTION_TIMEOUT), counters, fingerprint=FP_A)
    assert decision.next_state is TaskState.UP_FOR_RETRY
    assert decision.fingerprint_streak == 0
    spent = budget(infrastructure_try_number=5, last_fingerprint=FP_A, fingerprint_streak=1)
    fell_through = run(failure(Reason.DB_CONNECTION_ERROR), spent, fingerprint=FP_A)
    assert fell_through.next_state is TaskState.UP_FOR_RETRY


def test_it_dead_letters_rather_than_fails_on_the_last_try() -> None:
    """A poisoned last try goes to dead_letter so that an operator looks, instead of failing downstream."""
    counters = budget(try_number=2, max_tries=2, last_fingerprint=FP_A, fingerprint_streak=1)
    decision = run(failure(Reason.TASK_EXCEPTION), counters, fingerprint=FP_A)
    assert decision.next_state is TaskState.DEAD_LETTER


def test_it_keeps_the_last_fingerprint_when_a_failure_has_none() -> None:
    """The task's failure_fingerprint stays the last one seen, with its streak broken."""
    decision = run(failure(Reason.EXECUTION_TIMEOUT), budget(last_fingerprint=FP_A, fingerprint_streak=1))
    assert (decision.fingerprint, decision.fingerprint_streak) == (FP_A, 0)


# --- properties over every input -----------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    context: ExecutionContext
    budget: Budget
    args: RetryArgs
    platform: PlatformSettings
    fingerprint: str | None
    retry_after: float | None
    seed: int

    def decide(self) -> Decision:
        return decide(
            self.context,
            self.budget,
            self.args,
            self.platform,
            now=NOW,
            rng=random.Random(self.seed),
            fingerprint=self.fingerprint,
            retry_after=self.retry_after,
        )


seconds = st.floats(min_value=0, max_value=1000, allow_nan=False, allow_infinity=False)
fingerprints = st.sampled_from([None, FP_A, FP_B])


@st.composite
def contexts(draw: st.DrawFn) -> ExecutionContext:
    reason = draw(st.sampled_from(FAILURE_REASONS))
    metadata: dict[str, object] = {"note": draw(st.text(max_size=5))}
    if reason is Reason.PRE_EXECUTION_FAILURE:
        metadata["pre_execution_reason"] = draw(st.sampled_from(PRE_EXECUTION_KINDS))
    return ExecutionContext.of(reason, draw(st.sampled_from(list(Source))), **metadata)


@st.composite
def budgets(draw: st.DrawFn) -> Budget:
    max_tries = draw(st.integers(min_value=1, max_value=8))
    last = draw(fingerprints)
    return Budget(
        try_number=draw(st.integers(min_value=1, max_value=max_tries)),
        max_tries=max_tries,
        infrastructure_try_number=draw(st.integers(min_value=0, max_value=8)),
        pre_execution_tries=draw(st.integers(min_value=0, max_value=3)),
        last_fingerprint=last,
        fingerprint_streak=0 if last is None else draw(st.integers(min_value=0, max_value=4)),
    )


retry_args = st.builds(
    RetryArgs,
    retry_delay=seconds,
    retry_backoff=st.sampled_from(["exponential", "fixed"]),
    retry_max_delay=seconds,
    retry_jitter=st.sampled_from(["full", "equal", "none"]),
    infrastructure_retry_limit=st.integers(min_value=0, max_value=6),
    poison_threshold=st.integers(min_value=0, max_value=4),
)
platform_settings = st.builds(
    PlatformSettings,
    infrastructure_retry_delay=seconds,
    pre_execution_retries=st.integers(min_value=0, max_value=3),
    pre_execution_excluded_reasons=st.frozensets(st.sampled_from(PRE_EXECUTION_KINDS)),
)
scenarios = st.builds(
    Scenario,
    context=contexts(),
    budget=budgets(),
    args=retry_args,
    platform=platform_settings,
    fingerprint=fingerprints,
    retry_after=st.none() | st.floats(min_value=-10, max_value=1e5, allow_nan=False),
    seed=st.integers(min_value=0, max_value=2**32),
)


@FAST
@given(scenarios)
def test_it_never_drives_a_budget_negative(s: Scenario) -> None:
    """Counters never go below zero, and a platform retry never spends more than the limit."""
    d = s.decide()
    assert d.infrastructure_try_number >= 0
    assert d.pre_execution_tries >= 0
    assert d.fingerprint_streak >= 0
    if s.budget.infrastructure_try_number <= s.args.infrastructure_retry_limit:
        assert d.infrastructure_try_number <= s.args.infrastructure_retry_limit
    if d.is_platform_retry and s.context.reason is Reason.PRE_EXECUTION_FAILURE:
        assert d.pre_execution_tries <= s.platform.pre_execution_retries


@FAST
@given(scenarios)
def test_it_charges_exactly_one_budget(s: Scenario) -> None:
    """Platform: one more platform try, `scheduled`. User: the platform counter is untouched."""
    d = s.decide()
    if d.kind is AttemptKind.PLATFORM:
        assert d.next_state is TaskState.SCHEDULED
        assert s.context.category is Category.INFRASTRUCTURE
        assert s.budget.infrastructure_try_number < s.args.infrastructure_retry_limit
        assert d.infrastructure_try_number == s.budget.infrastructure_try_number + 1
        assert d.next_retry_at == NOW + timedelta(seconds=s.platform.infrastructure_retry_delay)
        assert d.task_context == d.attempt_context == s.context
        assert (d.fingerprint, d.fingerprint_streak) == (s.budget.last_fingerprint, s.budget.fingerprint_streak)
    else:
        assert d.kind is AttemptKind.USER
        assert d.next_state in (TaskState.UP_FOR_RETRY, TaskState.FAILED, TaskState.DEAD_LETTER)
        assert d.infrastructure_try_number == s.budget.infrastructure_try_number
        assert d.pre_execution_tries == 0


@FAST
@given(scenarios)
def test_it_retries_infrastructure_on_the_platform_while_it_can(s: Scenario) -> None:
    """Infrastructure with platform budget left is a platform retry, unless it is a pre-execution
    failure that is excluded or has used this user try's allowance."""
    d = s.decide()
    if s.context.category is not Category.INFRASTRUCTURE:
        assert d.kind is AttemptKind.USER
        return
    budget_left = s.budget.infrastructure_try_number < s.args.infrastructure_retry_limit
    if s.context.reason is Reason.PRE_EXECUTION_FAILURE:
        kind = s.context.metadata["pre_execution_reason"]
        allowed = kind not in s.platform.pre_execution_excluded_reasons and (
            s.budget.pre_execution_tries < s.platform.pre_execution_retries
        )
        assert d.is_platform_retry == (budget_left and allowed)
        if d.is_platform_retry:
            assert d.pre_execution_tries == s.budget.pre_execution_tries + 1
        else:
            # The attempt's context; the task's may wrap it further as poisoned.
            assert d.attempt_context.reason is Reason.STARTUP_ERROR
            assert d.attempt_context.category is Category.APPLICATION
            assert d.attempt_context.source is s.context.source
            assert d.attempt_context.metadata == s.context.metadata
    else:
        assert d.is_platform_retry == budget_left
        if not budget_left:
            assert d.attempt_context == s.context
            assert d.next_state is not TaskState.DEAD_LETTER


@FAST
@given(scenarios)
def test_it_follows_the_user_budget(s: Scenario) -> None:
    """A user charge retries while try_number < max_tries, within the backoff bounds or exactly
    after a RetryAfter; otherwise (or for non_retryable) the task fails, or is dead-lettered."""
    d = s.decide()
    if d.kind is not AttemptKind.USER:
        return
    if d.next_state is TaskState.DEAD_LETTER:
        return  # checked in test_it_dead_letters_only_a_poisoned_streak
    if s.context.reason is Reason.NON_RETRYABLE or s.budget.try_number >= s.budget.max_tries:
        assert d.next_state is TaskState.FAILED
        assert d.next_retry_at is None
        return
    assert d.next_state is TaskState.UP_FOR_RETRY
    assert d.next_retry_at is not None
    if s.retry_after is not None:
        assert d.next_retry_at == NOW + timedelta(seconds=max(0.0, s.retry_after))
        return
    exp = ceiling(s.budget.try_number, s.args.retry_delay, s.args.retry_backoff, s.args.retry_max_delay)
    low = {"full": 0.0, "equal": exp / 2, "none": exp}[s.args.retry_jitter]
    assert NOW + timedelta(seconds=low) <= d.next_retry_at <= NOW + timedelta(seconds=exp)
    bound = s.args.retry_delay if s.args.retry_backoff == "fixed" else s.args.retry_max_delay
    assert d.next_retry_at <= NOW + timedelta(seconds=bound)


@FAST
@given(scenarios)
def test_it_dead_letters_only_a_poisoned_streak(s: Scenario) -> None:
    """dead_letter happens exactly when an application failure extends a same-fingerprint streak
    to the threshold (never with threshold 0, never for non_retryable)."""
    d = s.decide()
    application_fingerprint = (
        s.fingerprint if d.kind is AttemptKind.USER and d.attempt_context.category is Category.APPLICATION else None
    )
    if application_fingerprint is None:
        expected_streak = 0
    elif application_fingerprint == s.budget.last_fingerprint:
        expected_streak = s.budget.fingerprint_streak + 1
    else:
        expected_streak = 1
    if d.kind is AttemptKind.USER:
        assert d.fingerprint_streak == expected_streak
    poisoned = (
        application_fingerprint is not None
        and s.context.reason is not Reason.NON_RETRYABLE
        and 0 < s.args.poison_threshold <= expected_streak
    )
    assert (d.next_state is TaskState.DEAD_LETTER) == poisoned
    if poisoned:
        assert d.next_retry_at is None
        assert d.task_context.reason is Reason.POISONED
        assert d.task_context.category is Category.APPLICATION
        assert d.task_context.metadata["fingerprint"] == application_fingerprint
        assert d.task_context.metadata["original_reason"] == d.attempt_context.reason.value
    else:
        assert d.task_context.reason is not Reason.POISONED


@FAST
@given(scenarios)
def test_it_decides_the_same_way_for_the_same_inputs(s: Scenario) -> None:
    """Time and randomness are injected: the same inputs give the same decision."""
    assert s.decide() == s.decide()


@st.composite
def events(draw: st.DrawFn) -> tuple[ExecutionContext, str | None]:
    context = draw(contexts())
    fingerprint = draw(st.sampled_from([FP_A, FP_B])) if context.reason in FINGERPRINTED_REASONS else None
    return context, fingerprint


@settings(deadline=None, max_examples=100)
@given(
    args=retry_args,
    platform=platform_settings,
    max_tries=st.integers(min_value=1, max_value=6),
    history=st.lists(events(), min_size=1, max_size=30),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_it_bounds_every_budget_over_a_whole_task_life(
    args: RetryArgs,
    platform: PlatformSettings,
    max_tries: int,
    history: list[tuple[ExecutionContext, str | None]],
    seed: int,
) -> None:
    """Over any sequence of failures: at most max_tries user attempts, at most the platform limit of
    platform retries, at most the pre-execution allowance per user try, try_number unchanged by a
    platform retry, and the poison streak counting only consecutive user failures."""
    rng = random.Random(seed)
    counters = Budget(try_number=1, max_tries=max_tries, infrastructure_try_number=0)
    user_attempts = platform_retries = 0
    pre_execution_this_try = 0
    streak_fp: str | None = None
    streak = 0
    for context, fingerprint in history:
        d = decide(context, counters, args, platform, now=NOW, rng=rng, fingerprint=fingerprint)
        if d.is_platform_retry:
            platform_retries += 1
            if context.reason is Reason.PRE_EXECUTION_FAILURE:
                pre_execution_this_try += 1
                assert pre_execution_this_try <= platform.pre_execution_retries
        else:
            user_attempts += 1
            pre_execution_this_try = 0
            # The poison streak, counted independently of the policy.
            if d.attempt_context.category is Category.APPLICATION and fingerprint is not None:
                streak = streak + 1 if fingerprint == streak_fp else 1
                streak_fp = fingerprint
            else:
                streak = 0
            assert d.fingerprint_streak == streak
        assert user_attempts <= max_tries
        assert platform_retries <= args.infrastructure_retry_limit
        assert d.infrastructure_try_number == platform_retries
        nxt = after(counters, d)
        assert nxt.try_number == counters.try_number + (0 if d.is_platform_retry else 1)
        counters = nxt
        if d.next_state in (TaskState.FAILED, TaskState.DEAD_LETTER):
            assert d.next_state is TaskState.FAILED or 0 < args.poison_threshold <= streak
            break
    else:
        # Still alive: the user budget cannot have been used up.
        assert user_attempts < max_tries


# --- operator actions -------------------------------------------------------------------------------

from retries.policy import cleared_max_tries, reclassified  # noqa: E402


@given(try_number=st.integers(0, 1000), retries=st.integers(0, 100))
def test_a_clear_gives_a_fresh_set_of_tries_on_top_of_those_used(try_number, retries):
    assert cleared_max_tries(try_number, retries) == try_number + retries + 1
    assert cleared_max_tries(try_number, retries) > try_number  # the next try always fits


def test_reclassifying_the_last_try_of_a_failed_task_repeats_it_on_the_platform_budget():
    budget = Budget(try_number=3, max_tries=3, infrastructure_try_number=1, last_fingerprint="aa", fingerprint_streak=1)
    given = reclassified(TaskState.FAILED, budget, attempt_try_number=3, attempt_fingerprint="bb")
    assert given.next_state is TaskState.SCHEDULED
    assert given.repeat_try
    assert given.infrastructure_try_number == 2
    assert given.fingerprint_streak == 1  # another fingerprint: the streak is not this failure's


def test_reclassifying_shrinks_the_poison_streak_it_was_part_of():
    budget = Budget(try_number=2, max_tries=4, infrastructure_try_number=0, last_fingerprint="aa", fingerprint_streak=2)
    given = reclassified(TaskState.DEAD_LETTER, budget, attempt_try_number=2, attempt_fingerprint="aa")
    assert (given.next_state, given.fingerprint_streak, given.repeat_try) == (TaskState.SCHEDULED, 1, True)


def test_reclassifying_an_older_failure_of_a_finished_task_changes_no_state():
    budget = Budget(try_number=2, max_tries=3, infrastructure_try_number=0)
    given = reclassified(TaskState.SUCCESS, budget, attempt_try_number=1, attempt_fingerprint=None)
    assert (given.next_state, given.repeat_try, given.infrastructure_try_number) == (TaskState.SUCCESS, False, 1)


def test_poison_detection_is_off_unless_asked_for():
    """The system default is 0: never dead-letter."""
    assert taskconfig.retry_args(taskconfig.system_defaults()).poison_threshold == 0
