"""The RQ worker class behind `run_worker`.

It runs each job in its own process (like RQ's SimpleWorker): the job is a supervisor that
starts the task process itself, so RQ's own work-horse fork would only be an extra layer.
It replaces RQ's signal handling: RQ's warm shutdown waits for the job forever and its cold
shutdown kills it without a word. Here SIGTERM or SIGINT stops taking jobs and lets the running
task go on for ORCHESTRATOR_WORKER_SHUTDOWN_GRACE seconds, after which the supervisor stops it
and reports `infrastructure/worker_termination`; a second signal ends the grace at once.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
from dataclasses import dataclass
from types import FrameType

from django.db import close_old_connections, connections
from rq.exceptions import StopRequested
from rq.job import Job
from rq.queue import Queue
from rq.worker import SimpleWorker, WorkerStatus

from orchestrator.worker.classify import signal_name
from orchestrator.worker.shutdown import SHUTDOWN

log = logging.getLogger(__name__)


def default_worker_name() -> str:
    return f"{socket.gethostname()}.{os.getpid()}"


@dataclass
class _Current:
    worker: OrchestratorWorker
    job: Job


_current: _Current | None = None


def current_worker_name() -> str | None:
    return _current.worker.name if _current is not None else None


def rq_heartbeat() -> None:
    """Keep RQ's own records of the running job alive (its registries, its dashboards)."""
    if _current is None:
        return
    for execution in list(_current.worker.executions.values()):
        _current.worker.maintain_heartbeats(_current.job, execution)


class OrchestratorWorker(SimpleWorker):
    def _install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._request_shutdown)
        signal.signal(signal.SIGINT, self._request_shutdown)

    def _request_shutdown(self, signum: int, frame: FrameType | None) -> None:
        name = signal_name(signum)
        again = SHUTDOWN.requested
        SHUTDOWN.request(name)
        self._stop_requested = True
        if self.get_state() != WorkerStatus.BUSY:
            raise StopRequested()
        if again:
            log.warning("worker %s: %s again; stopping the running task now", self.name, name)
        else:
            log.warning(
                "worker %s: %s; taking no new job, the running task may go on for its shutdown grace", self.name, name
            )

    def execute_job(self, job: Job, queue: Queue) -> None:
        global _current
        # Like django-rq: never carry a connection that may have gone stale across jobs.
        close_old_connections()
        _current = _Current(self, job)
        try:
            super().execute_job(job, queue)
        finally:
            _current = None
            close_old_connections()

    def teardown(self) -> None:
        super().teardown()
        connections.close_all()
