"""python manage.py db_clean --older-than DAYS [--dry-run] [--keep-failed-days DAYS] [--max-duty SHARE]

Deletes finished runs that ended more than DAYS ago, with their task instances, attempts,
output and deadlines, in small transactions, printing progress (see orchestrator.engine.retention).
It pauses after each transaction so that it works at most SHARE of the time (default
ORCHESTRATOR_RETENTION_DUTY, 0.5; 1 never pauses).
"""
from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from orchestrator.engine import retention
from orchestrator.foundation.clock import shared_now


def _days(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        raise CommandError(f"days must be a number, got {value!r}") from None
    if not days >= 0 or days == float("inf"):
        raise CommandError(f"days must be a finite number of days, 0 or more, got {value!r}")
    return days


def _duty(value: str) -> float:
    try:
        duty = float(value)
    except ValueError:
        raise CommandError(f"--max-duty must be a number, got {value!r}") from None
    if not 0 < duty <= 1:
        raise CommandError(f"--max-duty must be over 0 and at most 1 (a share of the time), got {value!r}")
    return duty


class Command(BaseCommand):
    help = "Delete finished runs older than --older-than days, with everything that hangs from them."

    def add_arguments(self, parser):
        parser.add_argument("--older-than", required=True, metavar="DAYS", help="Runs that ended more than DAYS ago.")
        parser.add_argument("--keep-failed-days", default=None, metavar="DAYS", help="Keep failed runs this long (if longer).")
        parser.add_argument("--dry-run", action="store_true", help="Only print what would be deleted.")
        parser.add_argument(
            "--max-duty", default=None, metavar="SHARE",
            help="Work at most this share of the time, pausing after each transaction in proportion to its time "
            "(over 0, at most 1; default ORCHESTRATOR_RETENTION_DUTY).",
        )

    def handle(self, *args, older_than: str, keep_failed_days: str | None, dry_run: bool, max_duty: str | None, **options):
        keep_failed = _days(keep_failed_days) if keep_failed_days is not None else None
        duty = _duty(max_duty) if max_duty is not None else float(settings.ORCHESTRATOR_RETENTION_DUTY)
        cutoff, failed_cutoff = retention.cutoffs(shared_now(), _days(older_than), keep_failed)
        self.stdout.write(f"successful runs that ended before {cutoff.isoformat()}, failed runs before {failed_cutoff.isoformat()}")
        if dry_run:
            found = retention.count(cutoff, failed_cutoff)
            self.stdout.write(
                f"would delete {found.runs} runs, {found.task_instances} task instances, "
                f"{found.attempts} attempts, {found.deadlines} deadlines (dry run: nothing deleted)"
            )
            return

        def progress(report: retention.CleanReport) -> None:
            if report.transactions % 20 == 0:
                self.stdout.write(self._line(report, "so far"))

        done = retention.clean(cutoff, failed_cutoff, duty=duty, progress=progress)
        self.stdout.write(self._line(done, "done"))

    @staticmethod
    def _line(report: retention.CleanReport, when: str) -> str:
        return (
            f"{when}: deleted {report.runs} runs, {report.task_instances} task instances, {report.attempts} attempts, "
            f"{report.deadlines} deadlines in {report.transactions} transactions (longest {report.longest_transaction:.2f} s), "
            f"paused {report.paused:.1f} s" + (f"; skipped {report.skipped} runs it could not delete (see the warnings)" if report.skipped else "")
        )
