"""python manage.py run_status DAG_ID RUN_ID [--json]; RUN_ID `latest` is the DAG's most recent run."""
from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from orchestrator.models import Dag, DagRun
from orchestrator.operations.documents import run_document

LATEST = "latest"


class Command(BaseCommand):
    help = "Print a run's state and its tasks (--json: the API's run document). RUN_ID 'latest': the DAG's most recent run."

    def add_arguments(self, parser):
        parser.add_argument("dag_id")
        parser.add_argument("run_id")
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args, dag_id: str, run_id: str, as_json: bool, **options):
        run = find_run(dag_id, run_id)
        doc = run_document(run)
        if as_json:
            self.stdout.write(json.dumps(doc, indent=2))
            return
        self.stdout.write(f"{doc['dag_id']} {doc['run_id']}: {doc['state']}")
        for ti in doc["task_instances"]:
            context = ti["last_failure_context"] or {}
            why = f" ({context.get('category')}/{context.get('reason')})" if context else ""
            label = ti["task_id"] if ti["map_index"] < 0 else f"{ti['task_id']}[{ti['map_index']}]"
            self.stdout.write(
                f"  {label:<30} {ti['state']:<16} try {ti['try_number']}/{ti['max_tries']}"
                f" platform {ti['infrastructure_try_number']}/{ti['infrastructure_retry_limit']}{why}"
            )


def find_run(dag_id: str, run_id: str) -> DagRun:
    """The run named, or with `latest` the one queued last (no run id is ever `latest`)."""
    if not Dag.objects.filter(dag_id=dag_id).exists():
        raise CommandError(f"unknown DAG '{dag_id}'")
    runs = DagRun.objects.select_related("dag").filter(dag__dag_id=dag_id)
    run = runs.order_by("-queued_at", "-id").first() if run_id == LATEST else runs.filter(run_id=run_id).first()
    if run is None:
        raise CommandError(f"DAG '{dag_id}' has no runs" if run_id == LATEST else f"no run '{run_id}' of DAG '{dag_id}'")
    return run
