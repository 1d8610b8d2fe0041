"""Backoff and jitter: `exp = min(retry_max_delay, retry_delay * 2 ** (try_number - 1))`."""
from __future__ import annotations

import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retries.backoff import ceiling, retry_delay_seconds

FAST = settings(deadline=None, max_examples=200)

delays = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
tries = st.integers(min_value=1, max_value=5000)
huge_tries = st.integers(min_value=5000, max_value=10**100)
backoffs = st.sampled_from(["exponential", "fixed"])
jitters = st.sampled_from(["full", "equal", "none"])
seeds = st.integers(min_value=0, max_value=2**32)


def documented_exp(try_number: int, retry_delay: float, backoff: str, max_delay: float) -> float:
    """The documented formula, in exact arithmetic so that it cannot overflow or round."""
    if backoff == "fixed":
        return float(Fraction(retry_delay))
    return float(min(Fraction(max_delay), Fraction(retry_delay) * 2 ** (try_number - 1)))


def delay(try_number: int, *, jitter: str, seed: int = 0, **kwargs: float | str) -> float:
    return retry_delay_seconds(try_number, jitter=jitter, rng=random.Random(seed), **kwargs)


def test_it_doubles_the_ceiling_each_try_up_to_the_cap() -> None:
    """retry_delay 2 s, cap 600 s: 2, 4, 8, ... 512, then 600 for ever."""
    ceilings = [ceiling(n, 2.0, "exponential", 600.0) for n in range(1, 13)]
    assert ceilings == [2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600, 600]


def test_it_waits_exactly_the_ceiling_without_jitter() -> None:
    """`none` jitter is the bare exponential ramp."""
    waits = [delay(n, jitter="none", retry_delay=1.5, max_delay=20.0) for n in range(1, 7)]
    assert waits == [1.5, 3.0, 6.0, 12.0, 20.0, 20.0]


def test_it_draws_full_jitter_as_uniform_from_zero_to_the_ceiling() -> None:
    """`full` waits uniform(0, exp): the same draw as the documented formula from the same seed."""
    got = delay(4, jitter="full", seed=7, retry_delay=2.0, max_delay=600.0)
    assert got == random.Random(7).uniform(0, 16.0)


def test_it_draws_equal_jitter_as_half_the_ceiling_plus_uniform_half() -> None:
    """`equal` waits exp/2 + uniform(0, exp/2)."""
    got = delay(4, jitter="equal", seed=7, retry_delay=2.0, max_delay=600.0)
    assert got == 8.0 + random.Random(7).uniform(0, 8.0)


def test_it_uses_retry_delay_as_the_ceiling_for_fixed_backoff() -> None:
    """`fixed` backoff does not grow with the try number."""
    waits = [delay(n, jitter="none", backoff="fixed", retry_delay=30.0, max_delay=600.0) for n in (1, 2, 10, 10**6)]
    assert waits == [30.0] * 4


def test_fixed_backoff_waits_its_delay_even_past_the_max_delay() -> None:
    """`fixed` uses retry_delay as the ceiling; retry_max_delay bounds the exponential growth only
    (as Airflow's max_retry_delay does)."""
    assert delay(1, jitter="none", backoff="fixed", retry_delay=900.0, max_delay=600.0) == 900.0
    assert 0 <= delay(1, jitter="full", backoff="fixed", retry_delay=900.0, max_delay=600.0) <= 900.0


def test_it_keeps_a_zero_retry_delay_at_zero_for_any_try() -> None:
    """0 * 2 ** n is 0 however large n is: a huge try number does not jump to the cap."""
    for try_number in (1, 65, 66, 1_000, 10**30):
        assert ceiling(try_number, 0.0, "exponential", 600.0) == 0.0


def test_it_follows_the_formula_past_sixty_four_doublings() -> None:
    """A tiny retry_delay doubled 65 times is still far below the cap."""
    assert ceiling(66, 1e-30, "exponential", 600.0) == 1e-30 * 2**65


def test_it_treats_try_zero_like_the_first_try() -> None:
    """Before the first dispatch there is no negative exponent: the ceiling is retry_delay."""
    assert ceiling(0, 2.0, "exponential", 600.0) == 2.0


@pytest.mark.parametrize("bad", [{"jitter": "random"}, {"backoff": "linear"}])
def test_it_refuses_an_unknown_backoff_or_jitter(bad: dict[str, str]) -> None:
    """A typo in a spec is an error, not a silent default."""
    kwargs = {"retry_delay": 1.0, "jitter": "full", "rng": random.Random(0)} | bad
    with pytest.raises(ValueError, match="is not a valid (Jitter|Backoff)"):
        retry_delay_seconds(1, **kwargs)


def test_it_spreads_a_herd_of_retries_over_the_window() -> None:
    """20 tasks failing together with full jitter and exp = 60 s do not retry in the same second."""
    rng = random.Random(20261121)
    waits = [retry_delay_seconds(3, retry_delay=15.0, max_delay=600.0, jitter="full", rng=rng) for _ in range(20)]
    assert all(0 <= w <= 60 for w in waits)
    # 20 draws into 60 one-second buckets fill about 17 on average.
    assert len({int(w) for w in waits}) >= 14


def test_it_sends_the_whole_herd_at_once_without_jitter() -> None:
    """The contrast: `none` jitter puts all 20 retries in the same second."""
    rng = random.Random(20261121)
    waits = [retry_delay_seconds(3, retry_delay=15.0, max_delay=600.0, jitter="none", rng=rng) for _ in range(20)]
    assert {int(w) for w in waits} == {60}


def test_it_draws_from_its_own_random_source_when_none_is_given() -> None:
    """Without an injected rng the delay is still within the full-jitter window."""
    for _ in range(50):
        assert 0 <= retry_delay_seconds(2, retry_delay=3.0, max_delay=600.0) <= 6.0


@FAST
@given(try_number=tries, retry_delay=delays, max_delay=delays, backoff=backoffs)
def test_it_computes_the_ceiling_exactly_as_documented(
    try_number: int, retry_delay: float, max_delay: float, backoff: str
) -> None:
    """`ceiling` equals the formula computed in exact arithmetic."""
    assert ceiling(try_number, retry_delay, backoff, max_delay) == documented_exp(try_number, retry_delay, backoff, max_delay)


@FAST
@given(try_number=tries, retry_delay=delays, max_delay=delays, backoff=backoffs, seed=seeds)
def test_it_keeps_full_jitter_between_zero_and_the_ceiling(
    try_number: int, retry_delay: float, max_delay: float, backoff: str, seed: int
) -> None:
    """Full jitter: 0 <= wait <= exp, and exp <= max_delay unless fixed."""
    exp = documented_exp(try_number, retry_delay, backoff, max_delay)
    wait = delay(try_number, jitter="full", seed=seed, retry_delay=retry_delay, backoff=backoff, max_delay=max_delay)
    assert 0 <= wait <= exp
    assert exp <= (retry_delay if backoff == "fixed" else max_delay)


@FAST
@given(try_number=tries, retry_delay=delays, max_delay=delays, backoff=backoffs, seed=seeds)
def test_it_keeps_equal_jitter_in_the_upper_half_of_the_ceiling(
    try_number: int, retry_delay: float, max_delay: float, backoff: str, seed: int
) -> None:
    """Equal jitter: exp/2 <= wait <= exp, and exp <= max_delay unless fixed."""
    exp = documented_exp(try_number, retry_delay, backoff, max_delay)
    wait = delay(try_number, jitter="equal", seed=seed, retry_delay=retry_delay, backoff=backoff, max_delay=max_delay)
    assert exp / 2 <= wait <= exp
    assert exp <= (retry_delay if backoff == "fixed" else max_delay)


@FAST
@given(try_number=tries, retry_delay=delays, max_delay=delays, backoff=backoffs, seed=seeds)
def test_it_waits_the_ceiling_itself_without_jitter(
    try_number: int, retry_delay: float, max_delay: float, backoff: str, seed: int
) -> None:
    """No jitter: wait == exp."""
    exp = documented_exp(try_number, retry_delay, backoff, max_delay)
    wait = delay(try_number, jitter="none", seed=seed, retry_delay=retry_delay, backoff=backoff, max_delay=max_delay)
    assert wait == exp


@FAST
@given(try_number=huge_tries, retry_delay=delays, max_delay=delays, jitter=jitters, seed=seeds)
def test_it_survives_huge_try_numbers(try_number: int, retry_delay: float, max_delay: float, jitter: str, seed: int) -> None:
    """Try 10**100 neither overflows nor escapes the cap; a zero delay stays zero."""
    exp = ceiling(try_number, retry_delay, "exponential", max_delay)
    assert exp == (max_delay if retry_delay > 0 else 0.0)
    wait = delay(try_number, jitter=jitter, seed=seed, retry_delay=retry_delay, max_delay=max_delay)
    assert 0 <= wait <= max_delay


@FAST
@given(try_number=tries, retry_delay=delays, max_delay=delays, backoff=backoffs, jitter=jitters, seed=seeds)
def test_it_is_deterministic_for_a_given_random_source(
    try_number: int, retry_delay: float, max_delay: float, backoff: str, jitter: str, seed: int
) -> None:
    """The same seed gives the same delay: time and randomness are injected."""
    kwargs = {"retry_delay": retry_delay, "backoff": backoff, "max_delay": max_delay}
    assert delay(try_number, jitter=jitter, seed=seed, **kwargs) == delay(try_number, jitter=jitter, seed=seed, **kwargs)
