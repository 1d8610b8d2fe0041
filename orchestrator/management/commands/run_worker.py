"""python manage.py run_worker [QUEUE ...] [--concurrency N]: an RQ worker for the project's queues."""
from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from orchestrator.foundation import redis_conn
from orchestrator.management.system_checks import ENGINE_PROCESS_CHECKS
from orchestrator.worker import failpoints
from orchestrator.worker.host import health
from orchestrator.worker.host.launcher import LaunchError
from orchestrator.worker.host.memory import MemoryLimits, MemoryLimitsUnavailable
from orchestrator.worker.host.procs import become_subreaper, become_undumpable
from orchestrator.worker.host.rqworker import OrchestratorWorker
from orchestrator.worker.host.runtime import default_worker_name
from orchestrator.worker.host.taskuser import TaskUserError, resolve


class Command(BaseCommand):
    help = "Run task instances from the given RQ queues (default: 'default')."
    requires_system_checks = ENGINE_PROCESS_CHECKS  # not the URL checks: see orchestrator/management/system_checks.py

    def add_arguments(self, parser):
        parser.add_argument("queues", nargs="*", metavar="QUEUE", help="Queues to take jobs from, in priority order.")
        parser.add_argument("--burst", action="store_true", help="Exit when the queues are empty.")
        parser.add_argument("--name", default=None, help="Worker name (default: HOSTNAME.PID).")
        parser.add_argument(
            "--concurrency",
            type=int,
            default=None,
            help="Attempts run at once, each in its own task process (default: ORCHESTRATOR_WORKER_CONCURRENCY, 16).",
        )

    def handle(self, *args, queues: list[str], burst: bool, name: str | None, concurrency: int | None, **options):
        if concurrency is not None and concurrency < 1:
            raise CommandError(f"--concurrency must be at least 1, not {concurrency}")
        try:
            failpoints.configured()
        except failpoints.FailpointError as exc:
            raise CommandError(str(exc)) from exc
        try:
            task_user = resolve(settings.ORCHESTRATOR_TASK_USER)
        except TaskUserError as exc:
            raise CommandError(str(exc)) from exc
        try:
            # A cgroup per attempt where it can make them; the cgroups of workers that died go.
            memory_limits = MemoryLimits.start(settings.ORCHESTRATOR_MEMORY_LIMITS)
        except MemoryLimitsUnavailable as exc:
            raise CommandError(str(exc)) from exc
        # Orphans of a task's process group come back to us, so none is left as a zombie.
        become_subreaper()
        # Tasks may run under our user: keep our environment and memory out of their reach.
        become_undumpable()
        # Probes over HTTP: a probe process in the container would hold its secrets (health.py).
        try:
            health.serve(settings.ORCHESTRATOR_WORKER_HEALTH_PORT)
        except OSError as exc:
            raise CommandError(f"ORCHESTRATOR_WORKER_HEALTH_PORT={settings.ORCHESTRATOR_WORKER_HEALTH_PORT}: {exc}") from exc
        # A connection of its own: RQ lengthens its socket timeout for blocking dequeues; a
        # connection to a Redis that stopped answering is found dead by its keepalives.
        connection = redis_conn.client_for(settings.REDIS_URL)
        worker = OrchestratorWorker(
            queues or ["default"],
            connection=connection,
            name=name or default_worker_name(),
            concurrency=concurrency or settings.ORCHESTRATOR_WORKER_CONCURRENCY,
            task_user=task_user,
            memory_limits=memory_limits,
        )
        try:
            worker.work(burst=burst, logging_level=None)
        except LaunchError as exc:  # its fork server could not start: no task could run here
            raise CommandError(str(exc)) from exc
        finally:
            memory_limits.close()
