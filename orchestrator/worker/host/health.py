"""The worker's own liveness and readiness probes: `GET /livez` and `GET /readyz` on
ORCHESTRATOR_WORKER_HEALTH_PORT, answered by a thread of the worker process.

Why HTTP and not `manage.py check_alive worker` run in the container: a process started there
gets the container's whole environment (`DATABASE_URL` with its password, `SECRET_KEY`,
`REDIS_URL`), and a task running under the same uid reads it from `/proc/<pid>/environ` while
it runs. An HTTP probe is made by the kubelet (or the compose healthcheck's `env -i` client)
from outside: nothing with a secret starts where a task can see it.

The rule is check_alive's (orchestrator/foundation/liveness.py): this host's newest worker heartbeat in
Redis is at most ORCHESTRATOR_HEARTBEAT_TIMEOUT old. `/livez` also answers 200 when Redis is out
of reach (a restart would not bring it back), `/readyz` does not. A frozen worker answers
nothing, which a probe's timeout counts as a failure. An answer holds the verdict's message
(the worker's name and its heartbeat's age), nothing else.

Tasks share the pod's network, so they can connect too: a connection gets REQUEST_TIMEOUT
seconds to send its request, and at most MAX_CLIENTS are served at once (more are closed at
once), so a task that opens connections and never writes cannot hold the probe for long.
"""
from __future__ import annotations

import logging
import socket
import socketserver
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import redis
from django.conf import settings

from orchestrator.foundation import liveness

log = logging.getLogger(__name__)

LIVENESS_PATH = "/livez"
READINESS_PATH = "/readyz"
REQUEST_TIMEOUT = 5.0
MAX_CLIENTS = 8

Judge = Callable[[], liveness.Verdict]


def worker_judge() -> Judge:
    """This host's worker heartbeat, judged as `check_alive worker` judges it."""
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=3, socket_connect_timeout=3)

    def judge() -> liveness.Verdict:
        return liveness.check(client, "worker", max_age=float(settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT))

    return judge


def answer(path: str, verdict: liveness.Verdict) -> int | None:
    """The status of a GET of `path` given the verdict; None for a path that is not a probe."""
    if path == LIVENESS_PATH:
        return 503 if verdict.alive is False else 200
    if path == READINESS_PATH:
        return 200 if verdict.alive is True else 503
    return None


class _Handler(BaseHTTPRequestHandler):
    server: HealthServer
    timeout = REQUEST_TIMEOUT  # on the connection's socket: a client that sends nothing is dropped
    server_version = "orchestrator-worker"
    sys_version = ""

    def do_GET(self) -> None:
        path = self.path.partition("?")[0]
        if path not in (LIVENESS_PATH, READINESS_PATH):
            self._reply(404, "not found")
            return
        try:
            verdict = self.server.judge()
        except Exception as exc:  # a probe must answer; a failing rule is a failing probe
            log.exception("the worker's health check failed")
            verdict = liveness.Verdict(False, f"the health check failed ({exc.__class__.__name__})")
        status = answer(path, verdict)
        assert status is not None
        self._reply(status, verdict.message)

    def _reply(self, status: int, text: str) -> None:
        body = (text + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("health probe from %s: " + format, self.client_address[0], *args)


class HealthServer(ThreadingHTTPServer):
    """The probe server: every address (IPv6 and IPv4 where the host has both), a thread per
    connection, at most `max_clients` at once."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, judge: Judge, *, max_clients: int = MAX_CLIENTS) -> None:
        dual = socket.has_dualstack_ipv6()
        self.address_family = socket.AF_INET6 if dual else socket.AF_INET
        self.judge = judge
        self._slots = threading.BoundedSemaphore(max_clients)
        super().__init__(("::" if dual else "0.0.0.0", port), _Handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        # Not HTTPServer's: it looks the address up in DNS (getfqdn) for a name nothing here uses.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "localhost", self.server_address[1]

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def serve(port: int | None, judge: Judge | None = None) -> HealthServer | None:
    """Start answering probes on `port` on a daemon thread (None: do nothing). Raises OSError
    when the port cannot be listened on."""
    if not port:
        return None
    server = HealthServer(port, judge or worker_judge())
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    log.info("answering health probes on port %d (%s, %s)", server.server_port, LIVENESS_PATH, READINESS_PATH)
    return server
