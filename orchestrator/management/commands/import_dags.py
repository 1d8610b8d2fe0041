"""`manage.py import_dags PATH [PATH ...]`: load DAG spec files, all or nothing."""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from orchestrator.specs.errors import SpecError
from orchestrator.specs.importer import import_paths


class Command(BaseCommand):
    help = "Import DAGs from YAML/JSON files or directories. On any error nothing is changed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "paths", nargs="+", metavar="PATH", help="a spec file, or a directory of *.yaml/*.yml/*.json"
        )
        parser.add_argument(
            "--strict", action="store_true", help="refuse a DAG whose retry budget can outlast a deadline (else a warning)"
        )

    def handle(self, *args: Any, paths: list[str], strict: bool = False, **options: Any) -> None:
        try:
            result = import_paths(paths, strict=strict)
        except SpecError as exc:
            count = len(exc.messages)
            raise CommandError(f"nothing imported; {count} problem{'s' if count != 1 else ''}:\n" + str(exc)) from exc
        for warning in result.warnings:
            self.stdout.write(warning)
        outcomes = {"created": result.created, "updated": result.updated, "unchanged": result.unchanged}
        for verb, dag_ids in outcomes.items():
            for dag_id in dag_ids:
                self.stdout.write(f"{verb} {dag_id}")
        total = len(result.created) + len(result.updated) + len(result.unchanged)
        self.stdout.write(
            self.style.SUCCESS(
                f"{total} DAG{'s' if total != 1 else ''}: {len(result.created)} created, "
                f"{len(result.updated)} updated, {len(result.unchanged)} unchanged"
            )
        )
