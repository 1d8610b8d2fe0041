"""`manage.py export_alert_rules [--include-secrets]`: every alert rule as YAML on stdout."""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from alerts.transfer import export_text


class Command(BaseCommand):
    help = "Write every alert rule in import_alert_rules' format; secret-looking notify_kwargs values masked."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--include-secrets", action="store_true", help="write notify_kwargs in full (webhook URLs, tokens)"
        )

    def handle(self, *args: Any, include_secrets: bool = False, **options: Any) -> None:
        self.stdout.write(export_text(include_secrets=include_secrets), ending="")
