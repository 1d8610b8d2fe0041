"""JSON messages, one per line, both ways over one Unix socket between the supervisor and its
task process (the only descriptor a task process holds besides 0, 1 and 2).

The task process writes "running", then its outcome; the supervisor writes the payload and the
results of the task's upstreams (JSON text it sends as it read it), "go"
after it recorded the handshake, and "stop" (with the reason) just before it sends SIGTERM.

Only the supervisor's direction is trusted. What the task process writes is the task's: the
supervisor reads it with a bounded reader (`LineReader(fd, max_bytes=..., max_depth=...)`), for
which every complete line must be a well-formed message: UTF-8 text, a JSON object, at most
`max_bytes` (ORCHESTRATOR_RESULT_MAX_BYTES plus MESSAGE_MARGIN_BYTES) and nested at most
MESSAGE_MAX_DEPTH levels. The size is checked before anything is decoded and the depth by a
linear scan before the JSON decoder runs, so nothing a task writes can make the decoder recurse
deeply or hold more than that much. The first line that is not one is the reader's `problem`
(invalid_result metadata, never the line itself) and everything after it is dropped.
"""
from __future__ import annotations

import json
import os
import re
import select
import time
from typing import Any

from orchestrator.foundation.results import MAX_DEPTH, deeper_than

# How much more than the largest value it may carry (a result, a task state value) a task's
# message may take: what an outcome says besides its result (an exception's message and
# traceback, clipped) and the message's own JSON.
MESSAGE_MARGIN_BYTES = 128 * 1024
# A message is an object around the values it carries, which may nest MAX_DEPTH levels.
MESSAGE_MAX_DEPTH = MAX_DEPTH + 1
# What one read takes from the channel.
READ_BYTES = 65536
# Characters JSON text may hold escaped but UTF-8 cannot encode (a lone surrogate).
_SURROGATE = re.compile("[\ud800-\udfff]")


def message_max_bytes(result_max_bytes: int, task_state_max_bytes: int = 0) -> int:
    """The largest line a task's channel takes: its largest value plus MESSAGE_MARGIN_BYTES."""
    return max(result_max_bytes, task_state_max_bytes) + MESSAGE_MARGIN_BYTES


def decode_message(line: bytes, max_bytes: int, max_depth: int = MESSAGE_MAX_DEPTH) -> dict[str, Any]:
    """One line from a task as a message, or MalformedMessage saying what is wrong with it."""
    if len(line) > max_bytes:
        raise MalformedMessage("too_large", f"a line of {len(line)} bytes, over {max_bytes}", size_bytes=len(line), max_bytes=max_bytes)
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedMessage("not_utf8", f"a line that is not UTF-8 text (byte {exc.start})") from None
    if deeper_than(text, max_depth):
        raise MalformedMessage("too_deep", f"a line nested deeper than {max_depth} levels", max_depth=max_depth)
    try:
        message = json.loads(text)
    except RecursionError:  # the depth scan should have stopped it: a last guard
        raise MalformedMessage("too_deep", f"a line nested deeper than {max_depth} levels", max_depth=max_depth) from None
    except ValueError as exc:
        raise MalformedMessage("not_json", f"a line that is not JSON ({getattr(exc, 'msg', type(exc).__name__)})") from None
    if not isinstance(message, dict):
        raise MalformedMessage("not_a_message", f"a line that is JSON but not an object (a {type(message).__name__})")
    return message


class MalformedMessage(Exception):
    """What a task wrote on its channel that is no well-formed message: `problem` is the
    invalid_result metadata saying what (never the text itself)."""

    def __init__(self, problem: str, detail: str, **facts: Any) -> None:
        super().__init__(detail)
        self.problem: dict[str, Any] = {"problem": problem, "channel": True, "detail": f"on the task's channel: {detail}", **facts}


class LineReader:
    """Reads newline-terminated JSON messages from a file descriptor without blocking forever.

    With `max_bytes` it reads a task's channel: every line must be a well-formed message
    (`decode_message`), the first that is not is kept as `problem`, and nothing after it is
    read as a message. Without, it reads the supervisor's trusted messages, of any size."""

    def __init__(self, fd: int, max_bytes: int | None = None, max_depth: int = MESSAGE_MAX_DEPTH) -> None:
        self.fd = fd
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self._buffer = bytearray()
        self.eof = False
        self.problem: dict[str, Any] | None = None

    @property
    def unfinished(self) -> int:
        """Bytes of a line not ended (at EOF: what a task left unfinished when it ended)."""
        return len(self._buffer)

    def feed(self) -> list[dict[str, Any]]:
        """Read what is available now (the fd is readable) and return the complete messages."""
        try:
            chunk = os.read(self.fd, READ_BYTES)
        except BlockingIOError:
            return []
        except OSError:
            chunk = b""
        if not chunk:
            self.eof = True
        elif self.problem is None:
            self._buffer += chunk
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
                chunk = os.read(self.fd, READ_BYTES)
            except OSError:
                chunk = b""
            if not chunk:
                self.eof = True
            elif self.problem is None:
                self._buffer += chunk

    def refuse(self, problem: dict[str, Any]) -> None:
        """Take nothing more from this channel: `problem` says why (the first one stays)."""
        if self.problem is None:
            self.problem = problem
        self._buffer.clear()

    def _drain_lines(self, limit: int | None = None) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        while self.problem is None and (limit is None or len(messages) < limit):
            end = self._buffer.find(b"\n")
            if end < 0:
                if self.max_bytes is not None and len(self._buffer) > self.max_bytes:
                    # No end in sight: judged now, not once it is too late to hold.
                    self.refuse(MalformedMessage("too_large", f"a line of more than {self.max_bytes} bytes",
                                                 max_bytes=self.max_bytes).problem)  # fmt: skip
                # A line left unfinished at EOF is a task killed while writing: not a message.
                break
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            if self.max_bytes is None:
                try:
                    message = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if isinstance(message, dict):
                    messages.append(message)
                continue
            try:
                messages.append(decode_message(line, self.max_bytes, self.max_depth))
            except MalformedMessage as exc:
                self.refuse(exc.problem)
        return messages


def send(fd: int, message: dict[str, Any], stall: float | None = None) -> bool:
    """Write one message; False if the other end is gone (or, on a descriptor that does not
    block, took nothing for `stall` seconds).

    As UTF-8, not as ASCII escapes, so that a message is about the size its values were measured
    at (ORCHESTRATOR_RESULT_MAX_BYTES counts a result's UTF-8); only a lone surrogate, which
    UTF-8 cannot carry, is escaped."""
    text = json.dumps(message, default=repr, ensure_ascii=False)
    return send_json_text(fd, _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text), stall)


def send_json_text(fd: int, text: str, stall: float | None = None) -> bool:
    """Write one message that is JSON text already (an object): sent as it is, not decoded and
    encoded again; False if the other end is gone, or took nothing for `stall` seconds."""
    # Outside a string a newline is only white space (inside one it is escaped), and one would
    # end the message early.
    data = (text.replace("\n", " ") + "\n").encode()
    try:
        while data:
            try:
                written = os.write(fd, data)
            except BlockingIOError:
                # The supervisor's end of a channel reads without blocking (one descriptor
                # both ways): its writes wait for room, but not for ever on a task that
                # stopped reading (its supervisor must go on to stop it).
                if not select.select([], [fd], [], stall)[1]:
                    return False
                continue
            data = data[written:]
    except (BrokenPipeError, OSError):
        return False
    return True
