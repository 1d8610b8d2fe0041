"""python manage.py check_alive scheduler|worker [--max-age S] [--ready]: a probe of this host's
scheduler or worker heartbeat (orchestrator/foundation/liveness.py). Exit 0 alive, 1 not."""
from __future__ import annotations

import sys

import redis
from django.conf import settings
from django.core.management.base import BaseCommand

from orchestrator.foundation import liveness


class Command(BaseCommand):
    help = "Exit 0 when this host's scheduler or worker has recorded a recent heartbeat, else 1."

    def add_arguments(self, parser):
        parser.add_argument("process", choices=["scheduler", "worker"])
        parser.add_argument(
            "--max-age",
            type=float,
            default=None,
            help="Seconds a heartbeat may be old (default: worker ORCHESTRATOR_HEARTBEAT_TIMEOUT, scheduler 60).",
        )
        parser.add_argument(
            "--ready",
            action="store_true",
            help="Readiness: Redis out of reach fails the check (by default it passes: a restart would not help).",
        )

    def handle(self, *args, process: str, max_age: float | None, ready: bool, **options):
        if max_age is None:
            max_age = float(settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT) if process == "worker" else 60.0
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=3, socket_connect_timeout=3)
        verdict = liveness.check(client, process, max_age=max_age)
        alive = verdict.alive if verdict.alive is not None else not ready
        (self.stdout if alive else self.stderr).write(verdict.message)
        if not alive:
            sys.exit(1)
