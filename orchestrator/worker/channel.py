"""JSON messages, one per line, over a pair of pipes between the supervisor and its task process.

The task process writes "running", then its outcome; the supervisor writes the payload and the
results of the task's upstreams (JSON text it sends as it read it), "go"
after it recorded the handshake, and "stop" (with the reason) just before it sends SIGTERM.
"""
from __future__ import annotations

import json
import os
import select
import time
from typing import Any

# A message larger than this is cut off: results are bounded before they are sent.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024


class LineReader:
    """Reads newline-terminated JSON messages from a file descriptor without blocking forever."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = bytearray()
        self.eof = False
        self.overflowed = False

    def feed(self) -> list[dict[str, Any]]:
        """Read what is available now (the fd is readable) and return the complete messages."""
        try:
            chunk = os.read(self.fd, 65536)
        except BlockingIOError:
            return []
        except OSError:
            chunk = b""
        if not chunk:
            self.eof = True
            return self._drain_lines()
        self._buffer += chunk
        if len(self._buffer) > MAX_MESSAGE_BYTES:
            self.overflowed = True
            del self._buffer[: len(self._buffer) - MAX_MESSAGE_BYTES]
        return self._drain_lines()

    def receive(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Block until one message arrives; None on EOF or after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            messages = self._drain_lines(limit=1)
            if messages:
                return messages[0]
            if self.eof:
                return None
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                readable, _, _ = select.select([self.fd], [], [], remaining)
            except InterruptedError:  # pragma: no cover - PEP 475 retries select itself
                continue
            if not readable:
                return None
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                self.eof = True
            self._buffer += chunk

    def _drain_lines(self, limit: int | None = None) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        while limit is None or len(messages) < limit:
            end = self._buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict):
                messages.append(message)
        return messages


def send(fd: int, message: dict[str, Any]) -> bool:
    """Write one message; False if the other end is gone."""
    return send_json_text(fd, json.dumps(message, default=repr))


def send_json_text(fd: int, text: str) -> bool:
    """Write one message that is JSON text already (an object): sent as it is, not decoded and
    encoded again; False if the other end is gone."""
    # Outside a string a newline is only white space (inside one it is escaped), and one would
    # end the message early.
    data = (text.replace("\n", " ") + "\n").encode()
    try:
        while data:
            written = os.write(fd, data)
            data = data[written:]
    except (BrokenPipeError, OSError):
        return False
    return True
