"""python manage.py backfill DAG_ID --from DATE --to DATE [--reprocess none|failed|completed]
[--max-active-runs N] [--backwards] [--conf JSON] [--dry-run] [--wait] [--timeout SECONDS]

stdout: the backfill's id on the first line; with --wait, its progress, then its final state on
the last line (exit 0 when every run succeeded, 1 otherwise, 2 on timeout). --dry-run prints one
line per logical date, `ISO-DATETIME create|skip|rerun`, and changes nothing. A bad argument:
an error naming it, exit 1, nothing created.
"""
from __future__ import annotations

import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from orchestrator.exceptions import ActionError
from orchestrator.management.commands.trigger_dag import ProgressDisplay, parse_conf
from orchestrator.models import Backfill, Dag
from orchestrator.operations import backfills

TIMEOUT_EXIT = 2
INTERRUPTED_EXIT = 130


class Command(BaseCommand):
    help = "Run a DAG once per scheduled logical date in a range; print the backfill's id."

    def add_arguments(self, parser):
        parser.add_argument("dag_id")
        parser.add_argument("--from", dest="start", required=True, help="First date (ISO 8601; naive = the DAG's timezone).")
        parser.add_argument("--to", dest="end", required=True, help="Last date, inclusive.")
        parser.add_argument("--reprocess", default="none", help="none (skip dates that have a run), failed, or completed.")
        parser.add_argument("--max-active-runs", dest="max_active_runs", default="10", help="The backfill's runs queued or running at once (default 10).")
        parser.add_argument("--backwards", action="store_true", help="Newest date first.")
        parser.add_argument("--conf", default=None, help="A JSON object passed to every run's tasks.")
        parser.add_argument("--dry-run", dest="dry_run", action="store_true", help="Print what each date would do; change nothing.")
        parser.add_argument("--wait", action="store_true", help="Wait for the backfill to end.")
        parser.add_argument("--timeout", type=float, default=None, help="Seconds to wait at most (exit 2).")

    def handle(self, *args: Any, dag_id: str, start: str, end: str, reprocess: str, max_active_runs: str, backwards: bool,
               conf: str | None, dry_run: bool, wait: bool, timeout: float | None, **options: Any) -> None:
        dag = Dag.objects.filter(dag_id=dag_id).first()
        if dag is None:
            raise CommandError(f"DAG_ID: unknown DAG '{dag_id}'")
        try:
            limit = int(max_active_runs)
        except ValueError:
            raise CommandError(f"--max-active-runs: must be a whole number, not {max_active_runs!r}") from None
        try:
            request = backfills.check(
                dag, start=start, end=end, reprocess=reprocess, max_active_runs=limit, backwards=backwards, conf=parse_conf(conf)
            )
            if dry_run:
                for planned in backfills.preview(request):
                    self.stdout.write(f"{planned.logical_date.isoformat()} {planned.action}")
                return
            backfill = backfills.create(request, None, created_by="cli")
        except backfills.BackfillError as exc:
            flag = "DAG_ID" if exc.argument == "dag_id" else "--" + exc.argument.replace("_", "-")
            raise CommandError(f"{flag}: {exc.problem}") from exc
        except ActionError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(str(backfill.pk))
        self.stdout.flush()
        if wait:
            self._wait(backfill, timeout)

    def _wait(self, backfill: Backfill, timeout: float | None) -> None:
        display = ProgressDisplay(self.stdout)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                backfill.refresh_from_db()
                runs = backfills.document(backfill)["runs"]
                display.show(
                    f"runs: {runs['success'] + runs['failed']}/{runs['total']} done, {runs['running'] + runs['queued']} running,"
                    f" {runs['failed']} failed, {runs['pending']} pending; backfill: {backfill.state}"
                )
                if backfills.is_over(backfill):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    display.end()
                    self.stdout.write("timeout")
                    sys.exit(TIMEOUT_EXIT)
                time.sleep(0.3)
        except KeyboardInterrupt:
            display.end()
            self.stderr.write(f"stopped waiting; the backfill goes on: GET /api/v1/backfills/{backfill.pk}")
            sys.exit(INTERRUPTED_EXIT)
        display.end()
        self.stdout.write(backfill.state)
        self.stdout.flush()
        sys.exit(0 if backfill.state == Backfill.State.SUCCESS else 1)
