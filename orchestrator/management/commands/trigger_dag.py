"""python manage.py trigger_dag DAG_ID [--conf JSON] [--wait] [--timeout SECONDS]"""
from __future__ import annotations

import json
import sys
import time

from django.core.management.base import BaseCommand, CommandError

from orchestrator.engine.runs import TriggerError, create_manual_run
from orchestrator.engine.waiting import wait_outcome
from orchestrator.models import Dag, DagRun

EXIT_CODES = {"success": 0, "failed": 1, "dead_letter": 3}
TIMEOUT_EXIT = 2


class Command(BaseCommand):
    help = "Create a manual run; print its run_id; with --wait, wait for its end and exit by its state."

    def add_arguments(self, parser):
        parser.add_argument("dag_id")
        parser.add_argument("--conf", default=None, help="A JSON object passed to the tasks as context['conf'].")
        parser.add_argument("--wait", action="store_true", help="Wait for the run to end.")
        parser.add_argument("--timeout", type=float, default=None, help="Seconds to wait at most (exit 2).")

    def handle(self, *args, dag_id: str, conf: str | None, wait: bool, timeout: float | None, **options):
        conf_value = parse_conf(conf)
        dag = Dag.objects.filter(dag_id=dag_id).first()
        if dag is None:
            raise CommandError(f"unknown DAG '{dag_id}'")
        try:
            run = create_manual_run(dag, conf=conf_value, triggered_by="cli")
        except TriggerError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(run.run_id)
        self.stdout.flush()
        if not wait:
            return
        outcome = wait_for(run, timeout)
        if outcome is None:
            self.stdout.write("timeout")
            sys.exit(TIMEOUT_EXIT)
        self.stdout.write(outcome)
        self.stdout.flush()
        sys.exit(EXIT_CODES[outcome])


def parse_conf(conf: str | None) -> dict | None:
    if conf is None:
        return None
    try:
        value = json.loads(conf)
    except json.JSONDecodeError as exc:
        raise CommandError(f"--conf is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise CommandError(f"--conf must be a JSON object, got {type(value).__name__}: {conf}")
    return value


def wait_for(run: DagRun, timeout: float | None, poll: float = 0.2) -> str | None:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        run.refresh_from_db()
        outcome = wait_outcome(run)
        if outcome is not None:
            return outcome
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(poll)
