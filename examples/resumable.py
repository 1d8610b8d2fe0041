"""A resumable task for the `example_resumable` DAG: it drives a job on the example job service
(`examples/jobservice.py`) and, when its worker is lost, the platform retry re-attaches to the
job instead of starting it again.

Try it under `make run`: trigger `example_resumable`, kill the worker that runs it
(`kill -9 <worker pid>`, shown on /workers), and watch the task page: the second attempt says
"reattached" and the job service saw one submit.
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from orchestrator.resumable import RemoteJob

DEFAULT_SERVICE = "http://127.0.0.1:8765"
# Every call to the service is bounded: a service that hangs fails the call, not the worker.
HTTP_TIMEOUT = 10.0


class JobServiceClient:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")


class ExportJob(RemoteJob):
    """Runs an export on the job service. Only the job's id is checkpointed (RemoteJob keeps it
    in the task state): the job's data stays in the service."""

    def __init__(self, seconds: float = 20, fail_times: int = 0, poll_interval: float = 1.0, service_url: str | None = None) -> None:
        self.seconds = seconds
        self.fail_times = fail_times
        self.poll_interval = poll_interval
        self.client = JobServiceClient(service_url or os.environ.get("EXAMPLE_JOB_SERVICE_URL", DEFAULT_SERVICE))

    def submit(self, key: str) -> str:
        status, job = self.client.call("POST", "/jobs", {"key": key, "seconds": self.seconds, "fail_times": self.fail_times})
        if status != 201:
            raise RuntimeError(f"the job service refused the job: {status} {job.get('error')}")
        return job["id"]

    def status(self, job_id: str) -> str:
        _, job = self.client.call("GET", f"/jobs/{job_id}")
        state = job.get("state")
        return state if state in ("running", "succeeded") else "failed"

    def result(self, job_id: str) -> Any:
        return self.client.call("GET", f"/jobs/{job_id}")[1].get("result")

    def cancel(self, job_id: str) -> None:
        self.client.call("POST", f"/jobs/{job_id}/cancel")

    def find(self, key: str) -> str | None:
        status, job = self.client.call("GET", f"/jobs?key={key}")
        return job["id"] if status == 200 else None


def load_in_batches(context: dict[str, Any], batches: int = 5) -> int:
    """A task that checkpoints its progress (an offset, not the data) and makes each batch's
    side effect idempotent: a retry skips the batches already done."""
    state = context["task_state"]
    done = state.get("batches_done", 0)
    for batch in range(done, batches):
        print(f"loading batch {batch} (idempotency key {context['idempotency_key']}-{batch})")
        state.set("batches_done", batch + 1)
    return batches
