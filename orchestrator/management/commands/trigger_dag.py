"""python manage.py trigger_dag DAG_ID [--conf JSON] [--logical-date ISO] [--wait] [--timeout SECONDS]

stdout: the run_id on the first line; with --wait, the run's progress, then its final state on
the last line. Progress is rewritten in place on a terminal and printed one line per change
otherwise, so scripts can still read the first and the last line.
"""
from __future__ import annotations

import getpass
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.core.management.base import BaseCommand, CommandError, OutputWrapper
from django.db.models import Count

from orchestrator.data.queue_listeners import listened_queues
from orchestrator.engine.run_wait import wait_outcome
from orchestrator.exceptions import ActionError, BadRequest
from orchestrator.foundation import run_params
from orchestrator.foundation.run_params import conf_from_text
from orchestrator.models import Dag, DagRun
from orchestrator.operations import actions
from retries.states import FINISHED_TASK_STATES, TaskState

EXIT_CODES = {"success": 0, "failed": 1, "dead_letter": 3}
TIMEOUT_EXIT = 2
INTERRUPTED_EXIT = 130


class Command(BaseCommand):
    help = "Create a manual run; print its run_id; with --wait, wait for its end and exit by its state."

    def add_arguments(self, parser):
        parser.add_argument("dag_id")
        parser.add_argument("--conf", default=None, help="A JSON object passed to the tasks as context['conf'].")
        parser.add_argument(
            "--logical-date", default=None, help="The run's logical date (ISO 8601; naive: in the DAG's timezone). Default: now."
        )
        parser.add_argument("--wait", action="store_true", help="Wait for the run to end.")
        parser.add_argument("--timeout", type=float, default=None, help="Seconds to wait at most (exit 2).")

    def handle(
        self, *args, dag_id: str, conf: str | None, logical_date: str | None, wait: bool, timeout: float | None, **options
    ):
        conf_value = parse_conf(conf)
        dag = Dag.objects.filter(dag_id=dag_id).first()
        if dag is None:
            raise CommandError(f"unknown DAG '{dag_id}'")
        try:
            # audited like the API and pages, with the operating-system user as who
            run = actions.trigger(dag, None, conf=conf_value, triggered_by="cli", actor=os_user(), logical_date=logical_date)
        except ActionError as exc:
            message = str(exc)
            if exc.field == "logical_date":  # in the command's words
                message = message.replace("logical_date", "--logical-date", 1)
            raise CommandError(message) from exc
        self.stdout.write(run.run_id)
        self.stdout.flush()
        if (note := actions.waits_for_unpause(dag)) is not None:
            self.stderr.write(note)
        if not wait:
            return
        display = ProgressDisplay(self.stdout)
        try:
            outcome = wait_for(run, timeout, on_poll=lambda: display.show(progress_of(run).text()))
        except KeyboardInterrupt:
            display.end()
            self.stderr.write(f"stopped waiting; the run goes on: manage.py run_status {dag_id} {run.run_id}")
            sys.exit(INTERRUPTED_EXIT)
        display.end()
        self.stdout.write(outcome or "timeout")
        self.stdout.flush()
        sys.exit(TIMEOUT_EXIT if outcome is None else EXIT_CODES[outcome])


def parse_conf(conf: str | None) -> dict | None:
    """--conf as JSON text, read as every entry point reads a conf; what it may hold is checked
    when the run (or backfill) is created, and refused there naming the key."""
    if conf is None:
        return None
    try:
        value = conf_from_text(conf, "--conf")
    except BadRequest as exc:
        raise CommandError(str(exc)) from None
    if not isinstance(value, dict):
        raise CommandError(f"--conf must be a JSON object, got {type(value).__name__}: {run_params.show(value)}")
    return value


def wait_for(
    run: DagRun, timeout: float | None, poll: float = 0.2, on_poll: Callable[[], None] = lambda: None
) -> str | None:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        run.refresh_from_db()
        on_poll()
        outcome = wait_outcome(run)
        if outcome is not None:
            return outcome
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(poll)


@dataclass(frozen=True)
class Progress:
    """How far a run has got: counts of its task instances by what they are doing."""

    run_state: str
    total: int
    done: int
    running: int
    queued: int
    failed: int
    retrying: int
    dead_letter: int
    unattended: tuple[str, ...] = ()  # queues its queued tasks wait in that no live worker reads

    def text(self) -> str:
        parts = [f"tasks: {self.done}/{self.total} done", f"{self.running} running", f"{self.failed} failed"]
        # Shown only when they occur, so the usual line stays short.
        for count, label in ((self.queued, "queued"), (self.retrying, "waiting to retry"), (self.dead_letter, "dead-lettered")):
            if count:
                parts.append(f"{count} {label}")
        waits = "".join(f"; waiting: no worker listens on queue '{queue}'" for queue in self.unattended)
        return f"{', '.join(parts)}; run: {self.run_state}{waits}"


def progress_of(run: DagRun) -> Progress:
    counts = dict(run.task_instances.values_list("state").annotate(n=Count("id")).order_by())
    return Progress(
        run_state=run.state,
        total=sum(counts.values()),
        done=sum(n for state, n in counts.items() if state in FINISHED_TASK_STATES),
        running=counts.get(TaskState.RUNNING, 0),
        queued=counts.get(TaskState.QUEUED, 0),
        failed=counts.get(TaskState.FAILED, 0) + counts.get(TaskState.UPSTREAM_FAILED, 0),
        retrying=counts.get(TaskState.UP_FOR_RETRY, 0),
        dead_letter=counts.get(TaskState.DEAD_LETTER, 0),
        unattended=unattended_queues(run) if counts.get(TaskState.QUEUED) else (),
    )


def unattended_queues(run: DagRun) -> tuple[str, ...]:
    """The queues the run's tasks wait in, not taken yet, that no live worker reads."""
    waiting = set(run.task_instances.filter(state=TaskState.QUEUED, heartbeat_at__isnull=True).values_list("queue", flat=True))
    listened = listened_queues() if waiting else None
    return tuple(sorted(waiting - listened)) if listened is not None else ()


class ProgressDisplay:
    """One progress line: rewritten in place on a terminal; elsewhere a new line per change."""

    def __init__(self, out: OutputWrapper) -> None:
        self.out = out
        self.in_place = out.isatty()
        self.last = ""

    def show(self, text: str) -> None:
        if text == self.last:
            return
        self.last = text
        if self.in_place:
            self.out.write(f"\r{text}\033[K", ending="")  # \033[K: clear what a longer line left
        else:
            self.out.write(text)
        self.out.flush()

    def end(self) -> None:
        """Finish the in-place line, so that what follows starts on a line of its own."""
        if self.in_place and self.last:
            self.out.write("")
            self.out.flush()


def os_user() -> str:
    """Who ran the command, for the audit log: the operating-system user, else "cli"."""
    try:
        return getpass.getuser() or "cli"
    except (OSError, KeyError):  # no USER/LOGNAME and no passwd entry (e.g. an arbitrary container uid)
        return "cli"
