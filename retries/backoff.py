"""The one rule for "how long until the next user retry"."""
from __future__ import annotations

import math
import random
from enum import StrEnum


class Backoff(StrEnum):
    EXPONENTIAL = "exponential"
    FIXED = "fixed"


class Jitter(StrEnum):
    FULL = "full"
    EQUAL = "equal"
    NONE = "none"


def ceiling(try_number: int, retry_delay: float, backoff: str, max_delay: float) -> float:
    """The un-jittered delay after user try `try_number` (1-based) failed."""
    if Backoff(backoff) is Backoff.FIXED:
        return retry_delay  # the delay itself: retry_max_delay bounds only what grows
    exponent = max(0, try_number - 1)
    try:
        # ldexp scales by a power of two exactly, and raises instead of returning inf or
        # failing on an int too large for a float (2 ** 10_000), so huge tries just hit the cap.
        # A zero delay stays zero whatever the try (0 * 2 ** n), as the formula says.
        raw = math.ldexp(retry_delay, exponent)
    except OverflowError:
        return max_delay
    return min(max_delay, raw)


def retry_delay_seconds(
    try_number: int,
    *,
    retry_delay: float,
    backoff: str = Backoff.EXPONENTIAL,
    max_delay: float = 600.0,
    jitter: str = Jitter.FULL,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before the next user try, with jitter drawn from `rng`."""
    rng = rng or random.Random()
    exp = ceiling(try_number, retry_delay, backoff, max_delay)
    mode = Jitter(jitter)
    if mode is Jitter.FULL:
        return rng.uniform(0, exp)
    if mode is Jitter.EQUAL:
        return exp / 2 + rng.uniform(0, exp / 2)
    return exp
