"""A small job service for the resumable example: it "runs" jobs for a few seconds each.

It stands in for Spark, a warehouse or a cloud batch service: jobs run on their own, whoever
submitted them, and survive the worker that submitted them. Start it with

    python -m examples.jobservice --port 8765

HTTP + JSON, loopback only by default:

- `POST /jobs` `{"key": K, "seconds": S, "fail_times": N}` → `{"id": ...}`. A key that already
  has a job that is running or succeeded gets that job back (submitting is idempotent); the
  first N jobs of a key fail (to show a resubmission).
- `GET /jobs/ID` → `{"id", "key", "state": "running" | "succeeded" | "failed" | "cancelled",
  "result"}`; `GET /jobs?key=K` → the newest job of that key, or 404.
- `POST /jobs/ID/cancel` → the job, cancelled if it was running.
- `GET /events` → every submit and cancel it took, in order (what the tests count);
  `GET /ledger` → every job with its key, state, `submitted_at` and `ended_at`.
"""
from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

MAX_BODY = 64 * 1024


@dataclass
class Job:
    id: str
    key: str
    seconds: float
    fails: bool
    submitted_at: float
    cancelled_at: float | None = None

    @property
    def cancelled(self) -> bool:
        return self.cancelled_at is not None

    def state(self, now: float) -> str:
        if self.cancelled:
            return "cancelled"
        if now < self.submitted_at + self.seconds:
            return "running"
        return "failed" if self.fails else "succeeded"

    def ended_at(self, now: float) -> float | None:
        if self.cancelled_at is not None:
            return self.cancelled_at
        end = self.submitted_at + self.seconds
        return end if now >= end else None

    def ledger_entry(self, now: float) -> dict[str, Any]:
        return {"id": self.id, "key": self.key, "state": self.state(now), "submitted_at": self.submitted_at, "ended_at": self.ended_at(now)}

    def document(self, now: float) -> dict[str, Any]:
        state = self.state(now)
        result = {"job_id": self.id, "rows": 1000} if state == "succeeded" else None
        return {"id": self.id, "key": self.key, "state": state, "result": result}


@dataclass
class JobBook:
    """The service's jobs and the log of what it was asked to do."""

    jobs: dict[str, Job] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def submit(self, key: str, seconds: float, fail_times: int) -> Job:
        with self.lock:
            now = time.time()
            same_key = [job for job in self.jobs.values() if job.key == key]
            for job in same_key:
                if job.state(now) in ("running", "succeeded"):
                    self.events.append({"event": "submit", "key": key, "id": job.id, "new": False, "at": now})
                    return job
            job = Job(id=uuid.uuid4().hex[:12], key=key, seconds=seconds, fails=len(same_key) < fail_times, submitted_at=now)
            self.jobs[job.id] = job
            self.events.append({"event": "submit", "key": key, "id": job.id, "new": True, "at": now})
            return job

    def cancel(self, job_id: str) -> Job | None:
        with self.lock:
            job = self.jobs.get(job_id)
            if job is not None:
                self.events.append({"event": "cancel", "key": job.key, "id": job.id, "was": job.state(time.time()), "at": time.time()})
                if job.state(time.time()) == "running":
                    job.cancelled_at = time.time()
            return job

    def ledger(self) -> list[dict[str, Any]]:
        """Every job it ever ran, with when it was submitted and ended."""
        with self.lock:
            now = time.time()
            return [job.ledger_entry(now) for job in sorted(self.jobs.values(), key=lambda job: job.submitted_at)]

    def newest_with_key(self, key: str) -> Job | None:
        with self.lock:
            jobs = [job for job in self.jobs.values() if job.key == key]
            return max(jobs, key=lambda job: job.submitted_at) if jobs else None


class JobServiceHandler(BaseHTTPRequestHandler):
    """The service's HTTP API over the book of jobs a subclass names (`handler_for`)."""

    book: JobBook

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the events say it all
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return None
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    def do_GET(self) -> None:
        url = urlparse(self.path)
        now = time.time()
        if url.path == "/events":
            with self.book.lock:
                return self._answer(200, list(self.book.events))
        if url.path == "/ledger":
            return self._answer(200, self.book.ledger())
        if url.path == "/jobs":
            key = (parse_qs(url.query).get("key") or [""])[0]
            job = self.book.newest_with_key(key)
            return self._answer(200, job.document(now)) if job else self._answer(404, {"error": f"no job with key {key!r}"})
        if url.path.startswith("/jobs/"):
            job = self.book.jobs.get(url.path.split("/")[2])
            return self._answer(200, job.document(now)) if job else self._answer(404, {"error": "no such job"})
        self._answer(404, {"error": "not found"})

    def do_POST(self) -> None:
        url = urlparse(self.path)
        if url.path == "/jobs":
            body = self._body()
            if body is None or not isinstance(body.get("key"), str) or not body["key"]:
                return self._answer(400, {"error": "a JSON body with a non-empty string 'key' is required"})
            try:
                seconds = float(body.get("seconds", 5))
                fail_times = int(body.get("fail_times", 0))
            except (TypeError, ValueError):
                return self._answer(400, {"error": "'seconds' and 'fail_times' must be numbers"})
            submitted = self.book.submit(body["key"], seconds, fail_times)
            return self._answer(201, submitted.document(time.time()))
        parts = url.path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "jobs" and parts[2] == "cancel":
            job = self.book.cancel(parts[1])
            return self._answer(200, job.document(time.time())) if job else self._answer(404, {"error": "no such job"})
        self._answer(404, {"error": "not found"})


def handler_for(book: JobBook) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (JobServiceHandler,), {"book": book})


def serve(host: str = "127.0.0.1", port: int = 8765) -> tuple[ThreadingHTTPServer, JobBook]:
    """A running service (in a thread of this process) and its book of jobs."""
    book = JobBook()
    server = ThreadingHTTPServer((host, port), handler_for(book))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="jobservice", daemon=True).start()
    return server, book


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    options = parser.parse_args()
    server = ThreadingHTTPServer((options.host, options.port), handler_for(JobBook()))
    print(f"job service on http://{options.host}:{server.server_port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
