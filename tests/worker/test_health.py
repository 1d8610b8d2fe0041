"""The worker's health endpoint (orchestrator/worker/host/health.py): GET /livez and /readyz by
the rule `check_alive worker` uses, on a server of its own and in a real `run_worker` that is
alive, frozen (SIGSTOP) or has lost its heartbeat record."""
from __future__ import annotations

import http.client
import os
import signal
import socket
import time
from collections.abc import Iterator

import pytest

from orchestrator.foundation.liveness import Verdict
from orchestrator.worker.host import health
from tests.conftest import wait_until


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(port: int, path: str, method: str = "GET", timeout: float = 5.0) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def answers(port: int, path: str = "/livez", timeout: float = 2.0) -> tuple[int, str] | None:
    """The answer, or None when nothing answers within `timeout` (refused, or no reply)."""
    try:
        return get(port, path, timeout=timeout)
    except OSError:
        return None


# --- the server, with a verdict the test sets -----------------------------------------------------


@pytest.fixture
def verdict_server() -> Iterator[tuple[int, list[Verdict]]]:
    verdicts = [Verdict(True, "worker host.1: last heartbeat 0.5s ago")]
    server = health.serve(free_port(), judge=lambda: verdicts[-1])
    assert server is not None
    yield server.server_port, verdicts
    server.shutdown()
    server.server_close()


def test_it_answers_liveness_and_readiness_by_the_verdict(verdict_server):
    port, verdicts = verdict_server
    assert get(port, "/livez") == (200, "worker host.1: last heartbeat 0.5s ago\n")
    assert get(port, "/readyz")[0] == 200
    verdicts.append(Verdict(None, "cannot tell whether the worker is alive: Redis is out of reach (ConnectionError)"))
    assert get(port, "/livez")[0] == 200  # a restart would not bring Redis back
    assert get(port, "/readyz") == (503, "cannot tell whether the worker is alive: Redis is out of reach (ConnectionError)\n")
    verdicts.append(Verdict(False, "worker host.1: last heartbeat 40s ago (more than 30s)"))
    assert get(port, "/livez") == (503, "worker host.1: last heartbeat 40s ago (more than 30s)\n")
    assert get(port, "/readyz")[0] == 503


def test_it_answers_get_only_and_only_its_two_paths(verdict_server):
    port, _ = verdict_server
    for method in ("POST", "PUT", "DELETE", "HEAD"):
        assert get(port, "/livez", method=method)[0] == 501, method
    assert get(port, "/")[0] == 404
    assert get(port, "/livez/../admin")[0] == 404
    assert get(port, "/livez?verbose=1")[0] == 200


def test_a_failing_rule_is_a_failing_probe():
    def broken() -> Verdict:
        raise RuntimeError("no")

    server = health.serve(free_port(), judge=broken)
    assert server is not None
    try:
        assert get(server.server_port, "/livez") == (503, "the health check failed (RuntimeError)\n")
    finally:
        server.shutdown()
        server.server_close()


def test_no_port_no_server():
    assert health.serve(None) is None


def test_garbage_and_silent_peers_do_not_hold_the_probe(verdict_server, monkeypatch):
    """A task shares the pod's network: what it sends to the port (NUL bytes, invalid UTF-8, a
    huge request line, nothing at all) gets an error or is dropped, and probes go on answering."""
    port, _ = verdict_server
    monkeypatch.setattr(health._Handler, "timeout", 0.5)
    for garbage in (b"\x00\x00\x00\r\n\r\n", b"GET /\xff\xfe HTTP/1.1\r\n\r\n", b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as peer:
            try:
                peer.sendall(garbage)
                reply = peer.recv(100)
            except (ConnectionResetError, BrokenPipeError):
                reply = b""
        assert not reply.startswith(b"HTTP/1.0 200"), garbage[:20]
        assert not reply.startswith(b"HTTP/1.1 200"), garbage[:20]
    # Peers that connect and never send: one does not delay a probe; as many as the server
    # serves at once make it drop the next connection until their time is up.
    silent = [socket.create_connection(("127.0.0.1", port), timeout=5)]
    try:
        assert get(port, "/livez", timeout=2)[0] == 200
        silent += [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(health.MAX_CLIENTS)]
        wait_until(lambda: answers(port, timeout=2) is not None and answers(port, timeout=2)[0] == 200, timeout=10,
                   message="the silent peers to be dropped")
    finally:
        for peer in silent:
            peer.close()


# --- a real worker -------------------------------------------------------------------------------


@pytest.fixture(autouse=False)
def no_heartbeats_yet(process_env):
    """Forget the records of workers earlier tests ran on this host (this run's Redis database)."""
    from orchestrator.foundation.redis_conn import get_redis

    client = get_redis()
    for key in [*client.scan_iter("rq:worker:*"), "rq:workers"]:
        client.delete(key)


@pytest.mark.timeout(180)
def test_a_real_worker_answers_while_its_heartbeat_is_fresh(worker, process_env, no_heartbeats_yet):
    from orchestrator.foundation.redis_conn import get_redis

    port = free_port()
    proc = worker(ORCHESTRATOR_WORKER_HEALTH_PORT=port, ORCHESTRATOR_HEARTBEAT_TIMEOUT=2)
    status, body = wait_until(lambda: (a := answers(port)) and a[0] == 200 and a, timeout=60, interval=0.5,
                              message="the worker's first heartbeat")
    assert f"worker {socket.gethostname()}.{proc.pid}: last heartbeat" in body
    assert get(port, "/readyz")[0] == 200
    for name in ("SECRET_KEY", "DATABASE_URL", "REDIS_URL"):
        value = process_env.get(name)
        assert not value or value not in body, name

    # Frozen: the connection is accepted by the kernel, but nothing answers (a probe's timeout).
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        assert answers(port, timeout=2) is None
        assert time.monotonic() - started >= 1.5
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    wait_until(lambda: (a := answers(port)) and a[0] == 200, timeout=30, interval=0.5, message="the thawed worker")

    # Its record gone from Redis (as when it has not beaten for the record's lifetime): 503.
    client = get_redis()
    for key in client.smembers("rq:workers"):
        if key.decode().endswith(f".{proc.pid}"):
            client.srem("rq:workers", key)
            client.delete(key)
    status, body = get(port, "/livez")
    assert status == 503
    assert f"no worker of host {socket.gethostname()} has recorded a heartbeat" in body
    assert get(port, "/readyz")[0] == 503
    assert proc.poll() is None


def test_a_port_that_is_taken_stops_the_worker_saying_why(worker):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = worker(ORCHESTRATOR_WORKER_HEALTH_PORT=port)
        assert proc.wait(timeout=60) == 1
    wait_until(lambda: f"ORCHESTRATOR_WORKER_HEALTH_PORT={port}" in "".join(proc.log_lines), timeout=10, message="the reason")
