"""Failure fingerprints: the same bug gives the same 12 hex digits, whatever its message."""
from __future__ import annotations

import re
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from retries.fingerprint import (
    bash_fingerprint,
    exception_fingerprint,
    fingerprint_of,
    innermost_frame,
    last_line,
)

HEX12 = re.compile(r"[0-9a-f]{12}")
FAST = settings(deadline=None, max_examples=150)


def caught(raiser: Callable[[], object]) -> BaseException:
    """The exception `raiser` raises, with its traceback."""
    try:
        raiser()
    except BaseException as exc:
        return exc
    raise AssertionError("expected an exception")


# Each raise below sits on a line of its own: fingerprints depend on the exact line.
def raise_value_error(message: str) -> None:
    raise ValueError(message)


def raise_value_error_elsewhere(message: str) -> None:
    raise ValueError(message)


def raise_any(exc_type: type[BaseException], message: str) -> None:
    raise exc_type(message)


def parse_row(row: dict[str, int]) -> int:
    return row["amount"]  # KeyError raised here, whoever calls it


def settle_from_batch(row: dict[str, int]) -> int:
    return parse_row(row)


def settle_from_retry(row: dict[str, int]) -> int:
    return parse_row(row)


def test_it_gives_the_same_fingerprint_for_the_same_type_and_line_whatever_the_message() -> None:
    """KeyError: 42 and KeyError: 43 at the same line are the same bug."""
    first = fingerprint_of(caught(lambda: raise_value_error("row 42 has no amount")))
    second = fingerprint_of(caught(lambda: raise_value_error("row 43: totally different text")))
    assert first == second


def test_it_gives_a_different_fingerprint_for_a_different_line() -> None:
    """The same exception type raised from another line is another bug."""
    here = fingerprint_of(caught(lambda: raise_value_error("boom")))
    there = fingerprint_of(caught(lambda: raise_value_error_elsewhere("boom")))
    assert here != there


def test_it_gives_a_different_fingerprint_for_a_different_type_on_the_same_line() -> None:
    """Two exception types raised by the very same statement are told apart."""
    value_error = fingerprint_of(caught(lambda: raise_any(ValueError, "boom")))
    type_error = fingerprint_of(caught(lambda: raise_any(TypeError, "boom")))
    assert value_error != type_error


def test_it_tells_apart_exception_classes_that_share_a_name() -> None:
    """Two classes called `Error` in different modules are different types."""
    local_error = type("ValueError", (Exception,), {"__module__": "myteam.etl"})
    builtin = fingerprint_of(caught(lambda: raise_any(ValueError, "boom")))
    lookalike = fingerprint_of(caught(lambda: raise_any(local_error, "boom")))
    assert builtin != lookalike


def test_it_uses_the_innermost_frame_not_the_call_site() -> None:
    """A bug in a helper has one fingerprint however the helper was reached."""
    via_batch = caught(lambda: settle_from_batch({}))
    via_retry = caught(lambda: settle_from_retry({}))
    assert fingerprint_of(via_batch) == fingerprint_of(via_retry)
    filename, lineno = innermost_frame(via_batch.__traceback__)
    assert filename == __file__
    assert lineno == parse_row.__code__.co_firstlineno + 1


def test_it_is_twelve_lowercase_hex_digits() -> None:
    """Every kind of fingerprint fits the 12-character column and the API's format."""
    samples = [
        fingerprint_of(caught(lambda: raise_value_error("x"))),
        fingerprint_of(ValueError("never raised, so no traceback")),
        bash_fingerprint(1, "ERROR: Something Failed"),
        bash_fingerprint(0, ""),
        exception_fingerprint("builtins.KeyError", "/srv/dags/etl.py", 87),
    ]
    for fingerprint in samples:
        assert HEX12.fullmatch(fingerprint), fingerprint


def test_it_fingerprints_an_exception_that_was_never_raised() -> None:
    """An exception without a traceback still gets a stable fingerprint from its type."""
    assert innermost_frame(None) == ("<unknown>", 0)
    assert fingerprint_of(ValueError("a")) == fingerprint_of(ValueError("b"))
    assert fingerprint_of(ValueError("a")) != fingerprint_of(KeyError("a"))


def test_it_is_stable_across_processes_and_releases() -> None:
    """Fingerprints are stored and compared later, so the hash never depends on the process.

    These values are pinned: a change here splits every stored poison streak in two.
    """
    assert exception_fingerprint("builtins.ValueError", "etl/settle.py", 87) == "7ec61a2d8b6d"
    assert bash_fingerprint(2, "error: row 17 not found") == "7c214cc15355"


def test_it_ignores_digits_in_the_last_stderr_line_of_a_bash_task() -> None:
    """Row ids, counts and timestamps in the last stderr line do not split a bash fingerprint."""
    first = bash_fingerprint(1, "2026-11-21 02:00:01 ERROR row 42 rejected after 3 attempts")
    second = bash_fingerprint(1, "2026-11-22 02:00:07 ERROR row 97 rejected after 12 attempts")
    assert first == second


def test_it_ignores_a_number_at_the_end_of_the_last_stderr_line() -> None:
    """A line ending in a number matches the same line without it (no leftover space)."""
    assert bash_fingerprint(1, "curl failed, exit status 35") == bash_fingerprint(1, "curl failed, exit status")


def test_it_ignores_surrounding_whitespace_in_the_last_stderr_line() -> None:
    """Trailing newlines and indentation are not part of the message."""
    assert bash_fingerprint(1, "  disk full\n") == bash_fingerprint(1, "disk full")


def test_it_gives_different_bash_fingerprints_for_different_exit_codes() -> None:
    """Exit 1 and exit 2 with the same stderr are different failures."""
    assert bash_fingerprint(1, "disk full") != bash_fingerprint(2, "disk full")


def test_it_gives_different_bash_fingerprints_for_different_messages() -> None:
    """The words of the last stderr line count, only digits are dropped."""
    assert bash_fingerprint(1, "disk full") != bash_fingerprint(1, "permission denied")


def test_it_keeps_bash_and_python_fingerprints_apart() -> None:
    """A bash failure never collides with a Python one built from similar parts."""
    assert bash_fingerprint(1, "ValueError") != exception_fingerprint("ValueError", "", 1)


def test_it_takes_the_last_non_blank_line() -> None:
    """The line a bash fingerprint uses is the last one with text on it."""
    assert last_line("starting\nrow 3 ok\nERROR: boom\n\n  \n") == "ERROR: boom"
    assert last_line("only line") == "only line"
    assert last_line("") == ""
    assert last_line("\n \n\t\n") == ""


@FAST
@given(exit_code=st.integers(min_value=-255, max_value=255), line=st.text())
def test_it_drops_every_digit_from_a_bash_line(exit_code: int, line: str) -> None:
    """Removing the digits from the line beforehand never changes the fingerprint."""
    without_digits = re.sub(r"\d", "", line)
    assert bash_fingerprint(exit_code, line) == bash_fingerprint(exit_code, without_digits)
    assert HEX12.fullmatch(bash_fingerprint(exit_code, line))


@FAST
@given(
    exit_code=st.integers(min_value=0, max_value=255),
    words=st.text(alphabet=st.characters(categories=["L", "P", "Zs"]), max_size=40),
    digits=st.lists(st.integers(min_value=0, max_value=10**12), min_size=2, max_size=2),
)
def test_it_matches_bash_lines_that_differ_only_in_numbers(exit_code: int, words: str, digits: list[int]) -> None:
    """The same message with other numbers in it has the same fingerprint."""
    first = f"{digits[0]} {words} {digits[0]}"
    second = f"{digits[1]} {words} {digits[1]}"
    assert bash_fingerprint(exit_code, first) == bash_fingerprint(exit_code, second)


@FAST
@given(
    exc_type=st.sampled_from([ValueError, KeyError, TypeError, RuntimeError, ZeroDivisionError]),
    messages=st.lists(st.text(), min_size=2, max_size=2),
)
def test_it_never_lets_the_message_change_a_fingerprint(exc_type: type[Exception], messages: list[str]) -> None:
    """Any two messages raised at the same line give the same fingerprint."""
    first = fingerprint_of(caught(lambda: raise_any(exc_type, messages[0])))
    second = fingerprint_of(caught(lambda: raise_any(exc_type, messages[1])))
    assert first == second
    assert HEX12.fullmatch(first)


@FAST
@given(
    exc_types=st.lists(st.text(min_size=1), min_size=2, max_size=2, unique=True),
    filename=st.text(),
    lineno=st.integers(min_value=0, max_value=10**6),
)
def test_it_separates_types_lines_and_files(exc_types: list[str], filename: str, lineno: int) -> None:
    """Changing the type, the line or the file changes the fingerprint."""
    base = exception_fingerprint(exc_types[0], filename, lineno)
    assert exception_fingerprint(exc_types[1], filename, lineno) != base
    assert exception_fingerprint(exc_types[0], filename, lineno + 1) != base
    assert exception_fingerprint(exc_types[0], filename + "x", lineno) != base
