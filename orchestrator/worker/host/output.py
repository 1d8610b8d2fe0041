"""Bounded capture of a task's output: the first and last bytes of a stream, never all of it.

A task that prints a gigabyte must cost the worker at most head + tail bytes of memory and
the database at most that much text per stream.
"""
from __future__ import annotations


class BoundedCapture:
    """Keeps the first `head_bytes` and the last `tail_bytes` of everything fed to it."""

    def __init__(self, head_bytes: int, tail_bytes: int) -> None:
        self.head_bytes = max(0, int(head_bytes))
        self.tail_bytes = max(0, int(tail_bytes))
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_bytes - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if not data or self.tail_bytes == 0:
            return
        if len(data) >= self.tail_bytes:
            self._tail[:] = data[-self.tail_bytes :]
        else:
            self._tail += data
            excess = len(self._tail) - self.tail_bytes
            if excess > 0:
                del self._tail[:excess]

    @property
    def dropped(self) -> int:
        return self.total - len(self._head) - len(self._tail)

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def tail_text(self) -> str:
        """The end of the stream (for the last stderr line of a bash task)."""
        return _text(bytes(self._head + self._tail) if not self.truncated else bytes(self._tail))

    def text(self) -> str:
        """Head, a marker line saying how much was dropped, tail; valid UTF-8 with no NUL."""
        if not self.truncated:
            return _text(bytes(self._head + self._tail))
        head = bytes(self._head)
        separator = b"" if head.endswith(b"\n") or not head else b"\n"
        marker = f"{separator.decode()}... [{self.dropped} bytes dropped] ...\n"
        return _text(head) + marker + _text(bytes(self._tail))


def _text(data: bytes) -> str:
    # PostgreSQL text cannot hold NUL; a cut may split a UTF-8 sequence: replace both.
    return data.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
