"""Every budget rule: what a failed attempt charges and where the task goes next (`decide()`),
and what an operator's clear (`cleared_max_tries()`) and reclassify (`reclassified()`) give back.

`decide()` is the only place that turns a failure into a next state. The worker, the scheduler
and the API call these functions; they never do budget arithmetic themselves.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from retries.backoff import retry_delay_seconds
from retries.context import ExecutionContext
from retries.memory import exceeded_fingerprint
from retries.states import (
    NOT_RETRIED,
    PLATFORM_RETRYABLE,
    RESCHEDULED_BY_RECLASSIFY,
    AttemptKind,
    Category,
    Reason,
    Source,
    TaskState,
)

# A RetryAfter of "forever" (inf, 1e300) would overflow a datetime: a year is the same answer.
MAX_RETRY_AFTER_SECONDS = 365 * 24 * 3600.0


@dataclass(frozen=True)
class RetryArgs:
    """The task's effective retry settings (default_args merged with its own). No defaults here:
    they are `orchestrator.data.taskconfig.system_defaults()`, read into this by `retry_args()`."""

    retry_delay: float
    retry_backoff: str
    retry_max_delay: float
    retry_jitter: str
    infrastructure_retry_limit: int
    poison_threshold: int  # 0 = never dead-letter


@dataclass(frozen=True)
class PlatformSettings:
    """The ORCHESTRATOR_* settings of platform retries (read by `taskconfig.platform_settings()`)."""

    infrastructure_retry_delay: float
    pre_execution_retries: int
    pre_execution_excluded_reasons: frozenset[str]


@dataclass(frozen=True)
class Budget:
    """The counters of a task instance that the decision reads."""

    try_number: int
    max_tries: int
    infrastructure_try_number: int
    pre_execution_tries: int = 0  # platform requeues of pre-execution failures in this user try
    last_fingerprint: str | None = None
    fingerprint_streak: int = 0  # consecutive user failures with last_fingerprint


@dataclass(frozen=True)
class Decision:
    next_state: TaskState
    kind: AttemptKind  # which budget the failed attempt was charged to
    attempt_context: ExecutionContext  # the context recorded on the attempt
    task_context: ExecutionContext  # the task's last_failure_context
    next_retry_at: datetime | None
    infrastructure_try_number: int
    pre_execution_tries: int
    fingerprint: str | None  # the task's last application fingerprint (the poison streak's)
    fingerprint_streak: int
    attempt_fingerprint: str | None = None  # this attempt's: only application failures have one

    @property
    def is_platform_retry(self) -> bool:
        return self.kind is AttemptKind.PLATFORM


def decide(
    context: ExecutionContext,
    budget: Budget,
    args: RetryArgs,
    platform: PlatformSettings,
    *,
    now: datetime,
    rng: random.Random,
    fingerprint: str | None = None,
    retry_after: float | None = None,
) -> Decision:
    """Charge one failed attempt to the right budget and choose the task's next state."""
    if context.category is Category.INFRASTRUCTURE and context.reason in PLATFORM_RETRYABLE:
        platform_decision = _platform_retry(context, budget, args, platform, now)
        if platform_decision is not None:
            return platform_decision
        if context.reason is Reason.PRE_EXECUTION_FAILURE:
            # Excluded kind or spent per-try allowance: the user sees it as a startup error.
            context = context.with_reason(Reason.STARTUP_ERROR)
    return _user_charge(context, budget, args, now=now, rng=rng, fingerprint=fingerprint, retry_after=retry_after)


def _platform_retry(
    context: ExecutionContext,
    budget: Budget,
    args: RetryArgs,
    platform: PlatformSettings,
    now: datetime,
) -> Decision | None:
    """A retry on the platform budget, or None when it does not apply and the user pays."""
    if budget.infrastructure_try_number >= args.infrastructure_retry_limit:
        return None
    pre_execution_tries = budget.pre_execution_tries
    if context.reason is Reason.PRE_EXECUTION_FAILURE:
        kind = str(context.metadata.get("pre_execution_reason", "")).lower()
        if kind in platform.pre_execution_excluded_reasons:
            return None
        if pre_execution_tries >= platform.pre_execution_retries:
            return None
        pre_execution_tries += 1
    return Decision(
        next_state=TaskState.SCHEDULED,
        kind=AttemptKind.PLATFORM,
        attempt_context=context,
        task_context=context,
        next_retry_at=now + timedelta(seconds=platform.infrastructure_retry_delay),
        infrastructure_try_number=budget.infrastructure_try_number + 1,
        pre_execution_tries=pre_execution_tries,
        # Platform attempts are not user attempts: they neither break nor extend a poison streak.
        fingerprint=budget.last_fingerprint,
        fingerprint_streak=budget.fingerprint_streak,
    )


def _user_charge(
    context: ExecutionContext,
    budget: Budget,
    args: RetryArgs,
    *,
    now: datetime,
    rng: random.Random,
    fingerprint: str | None,
    retry_after: float | None,
) -> Decision:
    if context.category is not Category.APPLICATION:
        # Only application failures have a fingerprint: a timeout, or an
        # infrastructure failure that fell through to the user budget, breaks a poison streak.
        fingerprint = None
    # Nor does a task that went past its memory limit: it is no bug repeating itself.
    fingerprint = exceeded_fingerprint(fingerprint, context.reason)
    if fingerprint is not None and fingerprint == budget.last_fingerprint:
        streak = budget.fingerprint_streak + 1
    else:
        streak = 1 if fingerprint is not None else 0
    common: dict[str, Any] = dict(
        kind=AttemptKind.USER,
        attempt_context=context,
        infrastructure_try_number=budget.infrastructure_try_number,
        # This user try is over: the next one gets its own pre-execution allowance.
        pre_execution_tries=0,
        fingerprint=fingerprint if fingerprint is not None else budget.last_fingerprint,
        fingerprint_streak=streak,
        attempt_fingerprint=fingerprint,
    )
    if context.reason in NOT_RETRIED:
        return Decision(next_state=TaskState.FAILED, task_context=context, next_retry_at=None, **common)
    if fingerprint is not None and args.poison_threshold > 0 and streak >= args.poison_threshold:
        poisoned = context.with_reason(
            Reason.POISONED,
            original_reason=context.reason.value,
            fingerprint=fingerprint,
            consecutive_failures=streak,
        )
        return Decision(next_state=TaskState.DEAD_LETTER, task_context=poisoned, next_retry_at=None, **common)
    if budget.try_number >= budget.max_tries:
        return Decision(next_state=TaskState.FAILED, task_context=context, next_retry_at=None, **common)
    if retry_after is not None:
        # Exactly what the task asked for, kept within what a datetime can hold.
        delay = min(max(0.0, float(retry_after)), MAX_RETRY_AFTER_SECONDS)
    else:
        delay = retry_delay_seconds(
            max(1, budget.try_number),
            retry_delay=args.retry_delay,
            backoff=args.retry_backoff,
            max_delay=args.retry_max_delay,
            jitter=args.retry_jitter,
            rng=rng,
        )
    return Decision(
        next_state=TaskState.UP_FOR_RETRY,
        task_context=context,
        next_retry_at=now + timedelta(seconds=delay),
        **common,
    )


# --- waiting without holding a slot ------------------------------------------------------------


@dataclass(frozen=True)
class WaitStep:
    """Where a waiting task goes next: on waiting until `next_check_at` (a check, or for a
    rescheduled task its next dispatch), or, past its wait_timeout, failed (`timed_out`)."""

    timed_out: bool
    next_check_at: datetime | None
    timeout_at: datetime

    def timeout_context(self, source: Source, **metadata: Any) -> ExecutionContext:
        return ExecutionContext.of(Reason.WAIT_TIMEOUT, source, timeout_at=self.timeout_at.isoformat(), **metadata)


def wait_timeout_at(since: datetime, wait_timeout: float) -> datetime:
    """When a wait that began at `since` (a task's first reschedule, or its first check) times out."""
    return since + timedelta(seconds=min(max(0.0, float(wait_timeout)), MAX_RETRY_AFTER_SECONDS))


def rescheduled(*, since: datetime, now: datetime, delay: float, wait_timeout: float) -> WaitStep:
    """A python task raised Reschedule(delay): it is sent again after exactly that delay (neither
    budget charged, the same try), unless its wait began more than wait_timeout ago. A delay
    that ends past the timeout is cut to it: then the task fails as timeout/wait_timeout."""
    timeout_at = wait_timeout_at(since, wait_timeout)
    if now >= timeout_at:
        return WaitStep(True, None, timeout_at)
    delay = min(max(0.0, float(delay)), MAX_RETRY_AFTER_SECONDS)
    return WaitStep(False, min(now + timedelta(seconds=delay), timeout_at), timeout_at)


# Golden ratio's fractional part: consecutive keys get phases spread evenly over the interval.
_PHASE_STEP = 0.6180339887498949
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def check_phase(key: int) -> float:
    """A wait's own place in its poke_interval's cycle (0 <= phase < 1), from a stable key (its
    row's id): waits begun together get phases spread over the cycle, not one and the same."""
    return (key * _PHASE_STEP) % 1.0


def next_check(
    *,
    since: datetime,
    now: datetime,
    poke_interval: float,
    wait_timeout: float,
    met_at: datetime | None = None,
    checked: bool = True,
    phase: float | None = None,
) -> WaitStep:
    """A wait that is not met yet: checked again `poke_interval` seconds on (or at `met_at`, the
    time a time wait is met, if sooner), or at its timeout; past the timeout it fails. A wait no
    check can meet (an event, an approval: `checked` False) is only looked at at its timeout.

    With a `phase` (`check_phase`), the next check is the first instant after `now` at that
    phase of the poke_interval's cycle (counted from the epoch): never more than one
    poke_interval on, and thousands of waits checked in one pass are not all due again in one
    later pass, but spread over the interval (each then exactly one interval apart)."""
    timeout_at = wait_timeout_at(since, wait_timeout)
    if now >= timeout_at:
        return WaitStep(True, None, timeout_at)
    if not checked:
        return WaitStep(False, timeout_at, timeout_at)
    interval = max(1.0, float(poke_interval))
    at = now + timedelta(seconds=interval)
    if phase is not None:
        # In whole microseconds, so that the arithmetic is exact: now < at <= now + interval.
        cycle = round(interval * 1_000_000)
        since_epoch = (now - _EPOCH) // timedelta(microseconds=1)
        at = now + timedelta(microseconds=(round(phase % 1.0 * cycle) - since_epoch) % cycle or cycle)
    if met_at is not None:
        at = min(at, max(met_at, now))
    return WaitStep(False, min(at, timeout_at), timeout_at)


# --- operator actions ------------------------------------------------------------------------------


def cleared_max_tries(try_number: int, retries: int) -> int:
    """A cleared task gets a fresh set of tries on top of those it used: `retries + 1` more."""
    return try_number + retries + 1


@dataclass(frozen=True)
class Reclassified:
    """What giving back the retry of a user-charged failure does to the task."""

    next_state: TaskState  # scheduled if the task had failed or been dead-lettered for it, else unchanged
    infrastructure_try_number: int
    # The next dispatch repeats the reclassified try (a platform retry) instead of a new user try.
    repeat_try: bool
    fingerprint_streak: int


def reclassified(
    state: TaskState,
    budget: Budget,
    *,
    attempt_try_number: int,
    attempt_fingerprint: str | None,
) -> Reclassified:
    """An operator says the task's last user-charged failure was really the platform's.

    The retry is given back the way any platform retry works: the platform budget pays
    (`infrastructure_try_number + 1`, `max_tries` unchanged) and the next dispatch keeps the
    reclassified attempt's try number, so a task never shows more tries than it was allowed.
    A failure that is no longer the task's latest try (the task retried since) has nothing to
    repeat. The poison streak shrinks by one when the failure was part of it.
    """
    streak = budget.fingerprint_streak
    if attempt_fingerprint and attempt_fingerprint == budget.last_fingerprint:
        streak = max(0, streak - 1)
    latest_try = attempt_try_number == budget.try_number
    rescheduled = state in RESCHEDULED_BY_RECLASSIFY
    return Reclassified(
        next_state=TaskState.SCHEDULED if rescheduled else TaskState(state),
        infrastructure_try_number=budget.infrastructure_try_number + 1,
        repeat_try=latest_try and (rescheduled or state is TaskState.UP_FOR_RETRY),
        fingerprint_streak=streak,
    )
