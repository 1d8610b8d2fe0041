"""python manage.py db_clean --older-than DAYS [--dry-run] [--keep-failed-days DAYS]

Deletes finished runs that ended more than DAYS ago, with their task instances, attempts,
output and deadlines, in small transactions, printing progress (see orchestrator.engine.retention).
"""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from orchestrator.clock import shared_now
from orchestrator.engine import retention


def _days(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        raise CommandError(f"days must be a number, got {value!r}") from None
    if not days >= 0 or days == float("inf"):
        raise CommandError(f"days must be a finite number of days, 0 or more, got {value!r}")
    return days


class Command(BaseCommand):
    help = "Delete finished runs older than --older-than days, with everything that hangs from them."

    def add_arguments(self, parser):
        parser.add_argument("--older-than", required=True, metavar="DAYS", help="Runs that ended more than DAYS ago.")
        parser.add_argument("--keep-failed-days", default=None, metavar="DAYS", help="Keep failed runs this long (if longer).")
        parser.add_argument("--dry-run", action="store_true", help="Only print what would be deleted.")

    def handle(self, *args, older_than: str, keep_failed_days: str | None, dry_run: bool, **options):
        keep_failed = _days(keep_failed_days) if keep_failed_days is not None else None
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

        done = retention.clean(cutoff, failed_cutoff, progress=progress)
        self.stdout.write(self._line(done, "done"))

    @staticmethod
    def _line(report: retention.CleanReport, when: str) -> str:
        return (
            f"{when}: deleted {report.runs} runs, {report.task_instances} task instances, {report.attempts} attempts, "
            f"{report.deadlines} deadlines in {report.transactions} transactions (longest {report.longest_transaction:.2f} s)"
        )
