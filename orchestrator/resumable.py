"""`RemoteJob`: a task that drives a job elsewhere (a Spark job, a warehouse query, a cloud
batch job) and survives losing its worker without starting the job again.

Subclass it and implement `submit`, `status`, `result` and `cancel` (and `find`, if the job
service can look a job up by the key it was submitted with):

    class Report(RemoteJob):
        poll_interval = 10

        def __init__(self, day):
            self.day = day

        def submit(self, key):
            return client.submit("report", day=self.day, idempotency_key=key)
        def status(self, job_id):
            return {"RUNNING": "running", "DONE": "succeeded"}.get(client.state(job_id), "failed")
        def result(self, job_id):
            return client.output(job_id)
        def cancel(self, job_id):
            client.cancel(job_id)
        def find(self, key):
            return client.job_with_key(key)

`execute` keeps the job's id in the task state, so the next attempt of the same task instance
(a platform retry after a worker was lost, or a user retry) finds it again and decides:

| what it finds | it | decision |
| --- | --- | --- |
| a job that is still running | waits for it | `reattached` |
| a job that already succeeded | returns its result, submitting nothing | `already_succeeded` |
| a job that failed | submits anew | `resubmitted` |
| no job id | `find(key)`, treated like a stored id; else `submit(key)`, storing the id before waiting | `submitted` |

The decision is recorded on the attempt. A job that ends `failed` fails the attempt (an
application failure: the user's retries decide). `on_kill` leaves the job running when the
platform stops the task (the retry re-attaches) and cancels it on a timeout or an operator's
action.
"""
from __future__ import annotations

import sys
import time
from typing import Any

from retries.context import ExecutionContext
from retries.states import Category

RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
STATUSES = (RUNNING, SUCCEEDED, FAILED)
# The task state key that holds the job's id.
JOB_ID_KEY = "remote_job_id"


class RemoteJobFailed(Exception):
    """The remote job ended failed."""


class RemoteJob:
    poll_interval: float = 5.0

    # --- what a subclass implements ----------------------------------------------------------

    def submit(self, key: str) -> str:
        """Start the job; `key` is the same for every attempt of this task instance."""
        raise NotImplementedError

    def status(self, job_id: str) -> str:
        """"running", "succeeded" or "failed"."""
        raise NotImplementedError

    def result(self, job_id: str) -> Any:
        """What the task returns once the job succeeded."""
        raise NotImplementedError

    def cancel(self, job_id: str) -> None:
        raise NotImplementedError

    def find(self, key: str) -> str | None:
        """The id of a job submitted with `key`, if the service can tell; closes the window
        between a submit and storing its id."""
        return None

    # --- what the platform calls -----------------------------------------------------------------

    def execute(self, context: dict[str, Any]) -> Any:
        state = context["task_state"]
        key = context["idempotency_key"]
        self._job_id: str | None = None
        job_id = state.get(JOB_ID_KEY) or self.find(key)
        if job_id is None:
            decision, job_id = "submitted", self._submit(state, key)
        else:
            status = self._status(job_id)
            if status == SUCCEEDED:
                self._job_id = job_id
                self._decide(state, "already_succeeded", job_id)
                return self.result(job_id)
            if status == FAILED:
                decision, job_id = "resubmitted", self._submit(state, key)
            else:
                decision = "reattached"
                if state.get(JOB_ID_KEY) != job_id:
                    state.set(JOB_ID_KEY, job_id)  # found by its key: keep it for the next attempt
        self._job_id = job_id
        self._decide(state, decision, job_id)
        return self._wait(job_id)

    def on_kill(self, execution_context: ExecutionContext) -> None:
        job_id = getattr(self, "_job_id", None)
        if job_id is None:
            return
        why = f"{execution_context.category.value}/{execution_context.reason.value}"
        if execution_context.category == Category.INFRASTRUCTURE:
            _log(f"stopped by the platform ({why}): leaving remote job {job_id} running for the retry to re-attach")
            return
        _log(f"stopped ({why}): cancelling remote job {job_id}")
        self.cancel(job_id)

    # --- steps ------------------------------------------------------------------------------------

    def _submit(self, state: Any, key: str) -> str:
        job_id = str(self.submit(key))
        self._job_id = job_id
        state.set(JOB_ID_KEY, job_id)  # durable before we wait: a retry finds it
        return job_id

    def _status(self, job_id: str) -> str:
        status = self.status(job_id)
        if status not in STATUSES:
            raise ValueError(f"{type(self).__name__}.status({job_id!r}) returned {status!r}; expected one of {', '.join(STATUSES)}")
        return status

    def _decide(self, state: Any, decision: str, job_id: str) -> None:
        _log(f"remote job {job_id}: {decision}")
        record = getattr(state, "record_resume", None)
        if record is not None:
            record(decision)

    def _wait(self, job_id: str) -> Any:
        while True:
            status = self._status(job_id)
            if status == SUCCEEDED:
                return self.result(job_id)
            if status == FAILED:
                raise RemoteJobFailed(f"remote job {job_id} failed")
            time.sleep(self.poll_interval)


def _log(message: str) -> None:
    print(f"[resumable] {message}", file=sys.stderr, flush=True)
