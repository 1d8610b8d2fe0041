"""Bounded capture of a task's output: the first and last bytes of a stream, never all of it.

A task that prints a gigabyte must cost the worker at most head + tail bytes of memory and
the database at most that much text per stream. The whole output (up to its own cap) goes to
the output store as it comes (`StoredOutput`), when one is configured.
"""
from __future__ import annotations

import logging

from orchestrator.foundation.outputstore import AttemptKey, OutputStore, OutputWriter

log = logging.getLogger(__name__)


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


class StoredOutput:
    """An attempt's output on its way to the output store, which must never fail the task: the
    first error is logged as a warning, what was written is discarded (a file missing part of
    the output would mislead), and the rest of the output goes to the database only."""

    def __init__(self, store: OutputStore, attempt: AttemptKey, label: str) -> None:
        self.label = label
        self.writer: OutputWriter | None = None
        if store.enabled:
            try:
                self.writer = store.open_writer(attempt)
            except OSError as exc:
                self._give_up("open", exc)

    def feed(self, stream: str, data: bytes) -> None:
        if self.writer is None:
            return
        try:
            self.writer.write(stream, data)
        except OSError as exc:
            self._give_up("write", exc)

    def close(self) -> None:
        if self.writer is None:
            return
        try:
            self.writer.close()
        except OSError as exc:
            self._give_up("finish", exc)
        self.writer = None

    def _give_up(self, verb: str, exc: OSError) -> None:
        log.warning("%s: could not %s its output in the output store (%s); the database keeps its head and tail", self.label, verb, exc)
        if self.writer is not None:
            self.writer.discard()
        self.writer = None
