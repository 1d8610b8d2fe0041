"""orchestrator audit [--dag DAG_ID] [--run RUN_ID] [--task TASK_ID] [--action ACTION] [--user USER]
[--since ISO] [--limit N] [--json]: the audit log, newest first, as GET /api/v1/audit reads it."""
from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from orchestrator.console import audit
from orchestrator.exceptions import BadRequest

# Each option and the query parameter it stands for (console/audit.PARAMS).
OPTIONS = {"dag": "dag_id", "run": "run_id", "task": "task_id", "action": "action", "user": "user", "since": "since", "limit": "limit"}


class Command(BaseCommand):
    help = "Print the audit log, newest first: one line per entry, or --json the API's entries (one JSON list)."

    def add_arguments(self, parser):
        parser.add_argument("--dag", help="only entries of this DAG")
        parser.add_argument("--run", help="only entries of this run")
        parser.add_argument("--task", help="only entries of this task")
        parser.add_argument("--action", help="only this action (clear, mark_success, circuit_open, backfill_create, ...)")
        parser.add_argument("--user", help="only what this user did")
        parser.add_argument("--since", help="only entries at or after this ISO 8601 date or date-time (naive: UTC)")
        parser.add_argument("--limit", help="at most this many entries, the newest (1 to 1000, default 100)")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print the entries as one JSON list")

    def handle(self, *args, as_json: bool, **options):
        try:
            audit_filter = audit.parse({param: options[option] for option, param in OPTIONS.items()})
        except BadRequest as exc:
            raise CommandError(_as_option(str(exc))) from None
        rows = audit.page(audit_filter).rows
        if as_json:
            self.stdout.write(json.dumps([audit.document(entry) for entry in rows], indent=2))
            return
        for entry in rows:
            self.stdout.write(audit.line(entry))


def _as_option(message: str) -> str:
    """The parser's message in the command's words: `invalid since '...'` → `invalid --since '...'`."""
    for option, param in OPTIONS.items():
        if message.startswith(f"invalid {param} "):
            return f"invalid --{option} " + message.removeprefix(f"invalid {param} ")
    return message
