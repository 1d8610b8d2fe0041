"""python manage.py run_local: web, one scheduler and workers on this machine (what `make run` calls)."""
from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from orchestrator.local.stack import LocalStack
from orchestrator.management.system_checks import ENGINE_PROCESS_CHECKS


class Command(BaseCommand):
    help = (
        "Migrate, load the example DAGs, create the admin user, then run the web server, one scheduler "
        "and workers until Ctrl-C. Starts the bundled Redis server when REDIS_URL is not set."
    )
    requires_system_checks = ENGINE_PROCESS_CHECKS  # not the URL checks: see orchestrator/management/system_checks.py

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1", help="Address the web server listens on (default 127.0.0.1).")
        parser.add_argument("--port", type=int, default=8000, help="Port of the web server (default 8000).")
        parser.add_argument("--workers", type=int, default=2, help="Number of worker processes (default 2).")
        parser.add_argument(
            "--concurrency",
            type=int,
            default=None,
            help="Attempts each worker runs at once (default ORCHESTRATOR_WORKER_CONCURRENCY, 16).",
        )
        parser.add_argument(
            "--state-dir",
            type=Path,
            help=(
                "Where the admin password, the embedded Redis data and the runtime file live (default var/). "
                "Commands in other terminals find the stack only through var/local-stack.json."
            ),
        )
        parser.add_argument("--dags", type=Path, help="Folder of DAG files to import (default ORCHESTRATOR_DAGS_FOLDER, else dags/).")

    def handle(self, *args, host: str, port: int, workers: int, concurrency: int | None, state_dir: Path | None, dags: Path | None, **options):
        if workers < 1:
            raise CommandError(f"--workers must be at least 1, got {workers}")
        if concurrency is not None and concurrency < 1:
            raise CommandError(f"--concurrency must be at least 1, got {concurrency}")
        if not 0 < port < 65536:
            raise CommandError(f"--port must be between 1 and 65535, got {port}")
        stack = LocalStack(host=host, port=port, workers=workers, concurrency=concurrency, state_dir=state_dir, dags_dir=dags, stream=self.stdout)
        code = stack.run()
        if code:
            raise SystemExit(code)
