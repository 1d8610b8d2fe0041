"""`manage.py import_alert_rules PATH`: load alert rules from a YAML or JSON list, all or nothing."""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from alerts.transfer import RulesError, import_path


class Command(BaseCommand):
    help = "Import alert rules from a YAML/JSON file (a list of rules). On any error nothing is changed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", metavar="PATH", help="a rules file (.yaml, .yml or .json)")

    def handle(self, *args: Any, path: str, **options: Any) -> None:
        try:
            result = import_path(path)
        except RulesError as exc:
            count = len(exc.messages)
            raise CommandError(f"nothing imported; {count} problem{'s' if count != 1 else ''}:\n" + str(exc)) from exc
        for verb, names in (("created", result.created), ("updated", result.updated), ("unchanged", result.unchanged)):
            for name in names:
                self.stdout.write(f"{verb} {name}")
        total = len(result.created) + len(result.updated) + len(result.unchanged)
        self.stdout.write(
            self.style.SUCCESS(
                f"{total} rule{'s' if total != 1 else ''}: {len(result.created)} created, "
                f"{len(result.updated)} updated, {len(result.unchanged)} unchanged"
            )
        )
