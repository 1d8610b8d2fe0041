"""Fixtures of the resume tests: the worker tests' real workers, the fault suite's schedulers and
private servers, and the example job service, run in the test process."""
from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from examples.jobservice import serve
from tests.faults.conftest import private_redis, records, scheduler_process  # noqa: F401  (fixtures)
from tests.worker.conftest import make_dag, queue_name, scheduler_settings, worker  # noqa: F401  (fixtures)


class JobService:
    """The example job service on a free loopback port; `events` is every submit and cancel."""

    def __init__(self) -> None:
        self.server, self.book = serve("127.0.0.1", 0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.url + "/events", timeout=5) as response:
            events = json.loads(response.read())
        return [e for e in events if kind is None or e["event"] == kind]

    def finish(self, job_id: str) -> None:
        """End a running job now (it succeeds, or fails if it was to fail)."""
        with self.book.lock:
            job = self.book.jobs[job_id]
            job.seconds = time.time() - job.submitted_at

    def ledger(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.url + "/ledger", timeout=5) as response:
            return json.loads(response.read())

    def new_submits(self) -> list[dict[str, Any]]:
        return [e for e in self.events("submit") if e["new"]]


@pytest.fixture
def job_service() -> Iterator[JobService]:
    service = JobService()
    try:
        yield service
    finally:
        service.server.shutdown()
        service.server.server_close()

