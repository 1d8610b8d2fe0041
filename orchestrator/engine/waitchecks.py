"""What one check of a wait sees: a time, another DAG's run, an HTTP endpoint.

`Seen` is a check's answer: met (with the task's result), failed (what was awaited ended
otherwise), or not yet. The time and dag_run checks read the database and are cheap, so the
scheduler's pass runs them itself; an HTTP check can hang, so it runs on `HttpChecks`' threads,
bounded by HTTP_CHECK_TIMEOUT, and the pass only collects what they saw.
"""
from __future__ import annotations

import http.client
import logging
import socket
import ssl
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

from deadlines.notifiers import NotifierError, _PinnedHTTP, _PinnedHTTPS, allowed_host, safe_addresses
from orchestrator.models import DagRun, TaskInstance
from retries.states import FAILED_TASK_STATES, RunState, TaskState

log = logging.getLogger(__name__)

# One HTTP check's bound, from its connect to the last byte read (the contract's 10 s).
HTTP_CHECK_TIMEOUT = 10.0
# What an HTTP check keeps of the body (the result's text is cut at 4,096 characters).
HTTP_TEXT_CHARS = 4096
HTTP_READ_BYTES = 256 * 1024
# HTTP checks running at once in one scheduler; due ones past this wait for the next pass.
HTTP_THREADS = 16


@dataclass(frozen=True)
class Seen:
    met: bool = False
    failed: bool = False
    result: Any = None
    met_at: datetime | None = None  # a time wait: when it will be met (its next check)
    detail: dict[str, Any] | None = None  # what the check saw (kept on the wait, in a failure's metadata)


NOT_YET = Seen()


def time_target(kind: str, spec: Any, logical_date: datetime, tz_name: str) -> datetime:
    """When a `time` or `time_after_logical_date` wait is met."""
    if kind == "time":
        # Checked at import (`specs/wait_schema.py`): an ISO 8601 date-time, naive = the DAG's timezone.
        target = spec if isinstance(spec, datetime) else datetime.fromisoformat(str(spec).strip())
        return target if target.tzinfo is not None else target.replace(tzinfo=ZoneInfo(tz_name))
    return logical_date + timedelta(seconds=float(spec))


def check_time(target: datetime, now: datetime) -> Seen:
    return Seen(met=True) if now >= target else Seen(met_at=target)


def check_dag_run(spec: dict[str, Any], logical_date: datetime) -> Seen:
    """The run of `spec["dag_id"]` at this logical date plus `offset` seconds (its `task_id`'s
    instances when given): succeeded, ended otherwise, or not yet (or no such run yet)."""
    at = logical_date + timedelta(seconds=float(spec.get("offset") or 0))
    runs = list(DagRun.objects.filter(dag__dag_id=spec["dag_id"], logical_date=at).order_by("-queued_at", "-id")[:10])
    if not runs:
        return NOT_YET
    task_id = spec.get("task_id")
    for run in runs:
        if task_id:
            states = set(TaskInstance.objects.filter(dag_run=run, task_id=task_id).values_list("state", flat=True))
            if states and states <= {TaskState.SUCCESS, TaskState.SKIPPED} and TaskState.SUCCESS in states:
                return Seen(met=True, result={"run_id": run.run_id})
        elif run.state == RunState.SUCCESS:
            return Seen(met=True, result={"run_id": run.run_id})
    latest = runs[0]
    if task_id:
        states = set(TaskInstance.objects.filter(dag_run=latest, task_id=task_id).values_list("state", flat=True))
        if states & {str(s) for s in FAILED_TASK_STATES}:
            return Seen(failed=True, detail={"dag_id": spec["dag_id"], "run_id": latest.run_id, "task_id": task_id, "states": sorted(states)})
    if latest.state == RunState.FAILED:
        return Seen(failed=True, detail={"dag_id": spec["dag_id"], "run_id": latest.run_id, "run_state": latest.state})
    return NOT_YET


def fetch(url: str, timeout: float) -> tuple[int, str]:
    """GET `url` from a host ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS lists (and, for an internal
    address, lists as an address), redirects not followed, the whole exchange within `timeout`
    seconds: the status and the start of the body as text. Raises NotifierError or OSError."""
    host = allowed_host(url)
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    connection_class = _PinnedHTTPS if parts.scheme == "https" else _PinnedHTTP
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    for address in safe_addresses(host, port):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        connection = connection_class(host, port, address, left)
        try:
            connection.request("GET", target, headers={"User-Agent": "orchestrator-wait", "Accept": "*/*"})
            response = connection.getresponse()
            body = b""
            while len(body) < HTTP_READ_BYTES:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no answer within {timeout:g}s")
                if connection.sock is not None:
                    connection.sock.settimeout(left)
                chunk = response.read1(min(65536, HTTP_READ_BYTES - len(body)))
                if not chunk:
                    break
                body += chunk
            return response.status, body.decode("utf-8", errors="replace")
        except (ConnectionError, socket.gaierror) as exc:  # refused or reset: the next address
            last_error = exc
        finally:
            connection.close()
    raise OSError(f"{host} unreachable: {last_error or 'no time left'}")


def check_http(spec: dict[str, Any], timeout: float) -> Seen:
    """One GET: met when it answers `status` (default 200) and, when given, its body holds
    `contains`. Runs on a check thread, never in the pass; reads no database."""
    try:
        status, text = fetch(str(spec["url"]), timeout)
    except NotifierError as exc:
        return Seen(detail={"error": str(exc)})
    except TimeoutError:
        return Seen(detail={"error": f"no answer within {timeout:g}s"})
    except (OSError, ssl.SSLError, http.client.HTTPException, ValueError) as exc:
        return Seen(detail={"error": f"{type(exc).__name__}: {exc}"[:500]})
    wanted = int(spec.get("status", 200))
    contains = spec.get("contains")
    if status == wanted and (not contains or str(contains) in text):
        return Seen(met=True, result={"status": status, "text": text[:HTTP_TEXT_CHARS]})
    return Seen(detail={"status": status})


class HttpChecks:
    """The scheduler's HTTP checks in flight: a bounded pool of threads, each check abandoned
    (seen as no answer) once it has run HTTP_CHECK_TIMEOUT plus a second. Kept in this process
    only: a check whose scheduler died is claimed again by another once its claim runs out."""

    _lock = threading.Lock()
    _pool: ThreadPoolExecutor | None = None
    # wait id -> (the check, the claim it was made under, when it started)
    pending: dict[int, tuple[Future[Seen], datetime, float]] = {}

    @classmethod
    def free(cls) -> int:
        return max(0, HTTP_THREADS - len(cls.pending))

    @classmethod
    def submit(cls, wait_id: int, spec: dict[str, Any], claimed: datetime) -> None:
        with cls._lock:
            if cls._pool is None:
                cls._pool = ThreadPoolExecutor(max_workers=HTTP_THREADS, thread_name_prefix="wait-http")
            future = cls._pool.submit(check_http, spec, HTTP_CHECK_TIMEOUT)
        cls.pending[wait_id] = (future, claimed, time.monotonic())

    @classmethod
    def finished(cls) -> list[tuple[int, datetime, Seen]]:
        """The checks that ended (or ran out of time) since the last look: (wait id, claim, what was seen)."""
        done = []
        for wait_id, (future, claimed, started) in list(cls.pending.items()):
            if future.done():
                try:
                    seen = future.result()
                except Exception as exc:  # a bug in the check: seen as not met, logged
                    log.exception("HTTP check of wait %s failed", wait_id)
                    seen = Seen(detail={"error": f"{type(exc).__name__}: {exc}"[:500]})
            elif time.monotonic() - started > HTTP_CHECK_TIMEOUT + 1:
                seen = Seen(detail={"error": f"no answer within {HTTP_CHECK_TIMEOUT:g}s"})  # abandoned
            else:
                continue
            del cls.pending[wait_id]
            done.append((wait_id, claimed, seen))
        return done

    @classmethod
    def forget_all(cls) -> None:
        cls.pending = {}

