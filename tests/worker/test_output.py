"""BoundedCapture: the head and tail of a stream, in bounded memory."""
from __future__ import annotations

from orchestrator.worker.host.output import BoundedCapture


def test_it_keeps_everything_that_fits():
    capture = BoundedCapture(10, 10)
    for chunk in (b"hello ", b"world\n"):
        capture.feed(chunk)
    assert capture.text() == "hello world\n"
    assert not capture.truncated


def test_it_keeps_the_head_and_tail_and_says_how_much_it_dropped():
    capture = BoundedCapture(5, 4)
    for i in range(100):
        capture.feed(f"{i:03d}\n".encode())
    assert capture.truncated
    assert capture.dropped == 400 - 9
    assert capture.text() == "000\n0\n... [391 bytes dropped] ...\n099\n"


def test_it_never_holds_more_than_head_plus_tail_bytes():
    capture = BoundedCapture(1000, 1000)
    for _ in range(1000):
        capture.feed(b"y" * 100_000)
    assert len(capture._head) + len(capture._tail) == 2000
    assert capture.total == 100_000_000


def test_it_yields_text_the_database_accepts():
    """NUL bytes and UTF-8 cut in half become replacement characters."""
    capture = BoundedCapture(3, 0)
    capture.feed("a\x00é".encode())
    assert capture.text().startswith("a\ufffd\ufffd")
    assert "\x00" not in capture.text()
