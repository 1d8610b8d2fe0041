"""orchestrator send_event NAME [--payload JSON] [--dag DAG_ID] [--run RUN_ID --task TASK_ID [--map-index N]]:
complete the tasks waiting for an event; one line per task it completed."""
from __future__ import annotations

import getpass
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from orchestrator.engine import waits
from orchestrator.exceptions import ActionError
from orchestrator.operations import actions


class Command(BaseCommand):
    help = (
        "Send the event NAME: to one task (--run and --task, with --dag where the run id is not enough; exit 1 when it is "
        "not waiting for it), or to every "
        "task waiting for it (of --dag only, when given; exit 0 even when none waited). Prints one line per task completed."
    )

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--payload", default=None, help="A JSON value: the tasks' result (default null).")
        parser.add_argument("--dag", dest="dag_id", default=None)
        parser.add_argument("--run", dest="run_id", default=None)
        parser.add_argument("--task", dest="task_id", default=None)
        parser.add_argument("--map-index", dest="map_index", type=int, default=None)

    def handle(self, *args: Any, name: str, payload: str | None, dag_id: str | None, run_id: str | None, task_id: str | None,
               map_index: int | None, **options: Any) -> None:
        value = _payload(payload)
        if (run_id is None) != (task_id is None):
            raise CommandError("--run and --task go together")
        if map_index is not None and task_id is None:
            raise CommandError("--map-index needs --run and --task")
        try:
            if task_id is not None:
                assert run_id is not None
                dag_id = dag_id or actions.dag_of_run(run_id)  # a run's id is enough where one DAG has it
                instances = actions.find_task_instances(dag_id, run_id, task_id, map_index)
                delivered = waits.send_event(name, value, actor=_os_user(), instances=instances)
            else:
                delivered = waits.send_event(name, value, actor=_os_user(), dag_id=dag_id)
        except ActionError as exc:
            raise CommandError(str(exc)) from None
        for done in delivered:
            label = done.task_id if done.map_index < 0 else f"{done.task_id}[{done.map_index}]"
            self.stdout.write(f"{done.dag_id} {done.run_id} {label}")


def _payload(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CommandError(f"--payload is not JSON: {exc}") from None


def _os_user() -> str:
    """Who sent it, for the audit log: the operating-system user running the command."""
    try:
        return getpass.getuser() or "cli"
    except (OSError, KeyError):  # no USER/LOGNAME and no passwd entry
        return "cli"
