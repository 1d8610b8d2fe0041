"""Messages between the supervisor and its task process, through a real pipe or socket."""
from __future__ import annotations

import json
import os
import socket
import threading
import time

from orchestrator.worker.channel import LineReader, send, send_json_text


def _through_a_pipe(*writes) -> list:
    read_fd, write_fd = os.pipe()
    reader = LineReader(read_fd)
    received: list = []

    def read_all() -> None:
        while (message := reader.receive(timeout=5)) is not None:
            received.append(message)

    thread = threading.Thread(target=read_all)
    thread.start()  # a message larger than the pipe's buffer needs its reader reading
    for write in writes:
        assert write(write_fd)
    os.close(write_fd)
    thread.join(timeout=10)
    os.close(read_fd)
    return received


def test_json_text_is_sent_as_it_is_one_message_whatever_its_white_space():
    results = {"source": [f"row-{i}" for i in range(20_000)], "note": "two\nlines \u2028 and a \"quote\""}
    pretty = json.dumps(results, indent=2)  # newlines between values: white space only
    received = _through_a_pipe(
        lambda fd: send(fd, {"type": "payload"}),
        lambda fd: send_json_text(fd, pretty),
        lambda fd: send_json_text(fd, "{}"),
    )
    assert received == [{"type": "payload"}, results, {}]


def test_a_message_larger_than_the_sockets_buffer_goes_whole_from_an_end_that_reads_without_blocking():
    """The supervisor's end of a channel is non-blocking (it reads through a selector, and writes
    on the same descriptor): a write past the socket's buffer waits for the reader, never fails."""
    ours, theirs = (end.detach() for end in socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM))
    os.set_blocking(ours, False)
    big = {"rows": ["x" * 1000] * 2000}  # some 2 MB: many times the buffer
    reader = LineReader(theirs)
    received: list = []
    thread = threading.Thread(target=lambda: received.append(reader.receive(timeout=10)))
    thread.start()
    try:
        assert send(ours, big)
        thread.join(timeout=10)
        assert received == [big]
    finally:
        os.close(ours)
        os.close(theirs)


def test_a_write_to_a_task_that_stopped_reading_gives_up_after_its_stall():
    """The supervisor must stay free to stop a task that reads nothing it is sent: a write that
    finds no room for `stall` seconds returns False instead of waiting for ever."""
    ours, theirs = (end.detach() for end in socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM))
    os.set_blocking(ours, False)
    try:
        began = time.monotonic()
        assert not send(ours, {"rows": ["x" * 1000] * 2000}, stall=0.3)  # nobody reads `theirs`
        assert 0.3 <= time.monotonic() - began < 5
        os.set_blocking(theirs, False)
        assert os.read(theirs, 65536)  # what did fit went through
    finally:
        os.close(ours)
        os.close(theirs)
