"""`manage.py export_dags [DAG_ID ...]`: write DAGs as a YAML list that import_dags reads back unchanged."""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from orchestrator.specs.exporter import UnknownDag, export_yaml


class Command(BaseCommand):
    help = "Write DAGs (all, or those named) to stdout as YAML in the import_dags format."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("dag_ids", nargs="*", metavar="DAG_ID")

    def handle(self, *args: Any, dag_ids: list[str], **options: Any) -> None:
        try:
            text = export_yaml(dag_ids)
        except UnknownDag as exc:
            raise CommandError(f"unknown DAG: {exc}") from exc
        self.stdout.write(text, ending="")
