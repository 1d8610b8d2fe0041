"""Every operator action, declared once: what it is called, who may take it, from which states,
what its request body carries besides a note, and what it does, in words. One kind of
declaration per thing acted on: a task instance (`TaskAction`; many at once on a mapped task's
page, a run's page or the dead letters' page: `BulkOffer`), an approval a task waits for
(`ApprovalAction`), a backfill (`BackfillAction`), a circuit (`CircuitAction`), a DAG
(`DagAction`).

The console (buttons, confirmations, explanations, routes), the API (routes, summaries, request
bodies, permissions) and the admin read these declarations; none of them names an action's
words itself. The rules of what an action does are its implementing function: for a task
action in `orchestrator.operations.actions` (`IMPLEMENTATIONS`), which also refuses by `allowed_from` here;
for a backfill `orchestrator.operations.backfills.act`; for an approval `engine.waits.decide`; for a
circuit `actions.operate_circuit`. Adding an action is one declaration below, and its function.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.data.taskconfig import args_for
from orchestrator.models import (
    ACT_PERMISSION,
    APPROVE_PERMISSION,
    CIRCUIT_PERMISSION,
    PAUSE_PERMISSION,
    TRIGGER_PERMISSION,
    Backfill,
)
from retries.budget import platform_retry_label
from retries.policy import cleared_max_tries
from retries.states import (
    ACTIVE_TASK_STATES,
    CLEAR_FROM,
    MARK_FAILED_FROM,
    MARK_SUCCESS_FROM,
    RESCHEDULED_BY_RECLASSIFY,
    TaskState,
)

if TYPE_CHECKING:
    from orchestrator.models import TaskInstance


# What a task action's API body carries besides its options.
TASK_NOTE = "Why: kept in the audit log and the task's context."
TASK_MAP_INDEX = "A mapped task's instance to act on; without it, every instance is acted on (each audited)."

# What an action does to one task instance, in words: `downstream` is every task of its run
# downstream of it, for the task page's full account; None for the short one of a run page's row.
Explainer = Callable[["TaskInstance", "Sequence[TaskInstance] | None"], str]


@dataclass(frozen=True)
class Option:
    """A yes-or-no choice an action takes besides its note: a field of its API body (false when
    absent) and a checkbox of its console form, under the same name."""

    name: str
    label: str  # its checkbox's words
    description: str


@dataclass(frozen=True)
class TaskAction:
    """One operator action on a task instance (on a mapped task: on each of its instances)."""

    name: str  # its URL segment and audit action: .../tasks/TASK_ID/NAME
    label: str  # its console button; "Confirm <label, lower case>" confirms it
    verb: str  # in a refusal: "cannot <verb> task 'x': it is running"
    past: str  # what a bulk action's message says was done: "Cleared: 3 task instances."
    summary: str  # its API operation
    done: str  # the confirmation read after it, of one task ({task})
    allowed_from: frozenset[str]  # the task states it acts from (the one list `actions.refusal` reads)
    explain: Explainer
    options: tuple[Option, ...] = ()
    danger: bool = False  # its button is marked dangerous
    permission: str = ACT_PERMISSION

    def confirmation(self, task: str, note: str) -> str:
        """The confirmation an operator reads after this action on `task`."""
        text = self.done.format(task=task)
        return f"{text} Noted: “{note}”." if note else text


@dataclass(frozen=True)
class BulkOffer:
    """A task action on many task instances at once, as a page offers it: on `scope` (a mapped
    task's "all" instances or its "failed" ones; a run's "failed" tasks; a dead-letter "group").
    In the label and the explanation `{n}` is how many there are, `{f}` how many failed."""

    action: str  # the TaskAction taken on each instance
    scope: str
    label: str
    explanation: str


@dataclass(frozen=True)
class ApprovalAction:
    """A decision on the approval a task waits for (on a mapped task: each instance's)."""

    name: str  # its URL segment: .../tasks/TASK_ID/NAME
    label: str  # its console button; "Confirm <label, lower case>" confirms it
    summary: str  # its API operation
    explanation: str  # what it does, on the task page
    done: str  # what the page says after it, of one task ({task})
    approves: bool  # approve, or reject
    danger: bool = False
    permission: str = APPROVE_PERMISSION

    def confirmation(self, task: str, note: str) -> str:
        text = self.done.format(task=task)
        return f"{text}: {note}" if note else text


@dataclass(frozen=True)
class BackfillAction:
    """An operator action on a backfill; it takes effect on the scheduler's next pass."""

    name: str  # its URL segment and audit action (backfill_NAME)
    label: str  # its console button
    summary: str  # its API operation
    allowed_from: frozenset[str]  # the backfill states it moves from (`backfills.moves_from`)
    # What it does, given the runs not started yet; the console asks to confirm an action that has one.
    explain: Callable[[int], str] | None = None
    danger: bool = False
    permission: str = TRIGGER_PERMISSION


@dataclass(frozen=True)
class CircuitAction:
    """An operator action on a circuit breaker (the API offers these; the admin only edits tunables)."""

    name: str  # its URL segment and audit action (circuit_NAME)
    summary: str  # its API operation
    permission: str = CIRCUIT_PERMISSION


@dataclass(frozen=True)
class DagAction:
    """An operator action on a whole DAG (the admin offers these on its selected DAGs)."""

    name: str
    label: str  # its button on the DAG's page
    admin_description: str
    permission: str


def _more_tries(ti: TaskInstance) -> int:
    """The tries a clear gives the task beyond those it used."""
    return cleared_max_tries(ti.try_number, int(args_for(ti)["retries"])) - ti.try_number


def _tries(n: int) -> str:
    return f"{n} more tr{'y' if n == 1 else 'ies'}"


def _upstream_failed(downstream: Sequence[TaskInstance]) -> list[str]:
    return [d.task_id for d in downstream if d.state == TaskState.UPSTREAM_FAILED]


def _explain_clear(ti: TaskInstance, downstream: Sequence[TaskInstance] | None) -> str:
    more = _more_tries(ti)
    if downstream is None:
        return f"the task runs again with {_tries(more)}; its upstream_failed downstream tasks run after it."
    text = f"The task runs again with {_tries(more)} (up to attempt {ti.try_number + more})"
    if waiting := _upstream_failed(downstream):
        text += f"; {', '.join(waiting)} (upstream_failed) will run after it"
    text += ". With downstream, every finished downstream task runs again too."
    return text + " Its task state is emptied (a resumable task then starts a new remote job) unless you keep it."


def _explain_mark_success(ti: TaskInstance, downstream: Sequence[TaskInstance] | None) -> str:
    if downstream is None:
        return "the task is recorded as succeeded without running; its downstream tasks may start."
    waiting = _upstream_failed(downstream)
    text = "The task is recorded as succeeded without running"
    return text + (f"; {', '.join(waiting)} will run." if waiting else "; its downstream tasks may start.")


def _explain_mark_failed(ti: TaskInstance, downstream: Sequence[TaskInstance] | None) -> str:
    stops = ti.state in ACTIVE_TASK_STATES
    if downstream is None:
        if stops:
            return f"stops the {ti.state} task (SIGTERM, then SIGKILL after the kill grace) and records it as failed, not retried."
        return "the task is recorded as failed and not retried."
    if stops:
        where = f" on {ti.worker_name}" if ti.worker_name else ""
        text = f"Stops the {ti.state} task{where}: its process group gets SIGTERM, then SIGKILL after the kill grace; it is not retried."
    else:
        text = "The task is recorded as failed and not retried."
    pending = [d.task_id for d in downstream if d.state in (TaskState.NONE, TaskState.SCHEDULED)]
    if pending:
        text += f" Downstream tasks waiting on it ({', '.join(pending)}) may become upstream_failed."
    return text


def _explain_reclassify(ti: TaskInstance, downstream: Sequence[TaskInstance] | None) -> str:
    retry = platform_retry_label(ti.infrastructure_try_number + 1, ti.infrastructure_retry_limit)
    again = f"(attempt {ti.try_number} of {ti.max_tries} again), using {retry}."
    if downstream is None:
        return f"its last user-charged failure is charged to the platform: that try repeats {again}"
    text = f"Its last user-charged failure is charged to the platform instead: that try is given back and repeats {again}"
    if ti.state in RESCHEDULED_BY_RECLASSIFY:
        text += " The task is scheduled again."
    return text


TASK_ACTIONS: dict[str, TaskAction] = {
    action.name: action
    for action in (
        TaskAction(
            name="clear",
            label="Clear",
            verb="clear",
            past="Cleared",
            summary="Run a finished, waiting or dead-lettered task again with a fresh set of tries",
            done="Cleared {task}: it runs again with a fresh set of tries.",
            allowed_from=CLEAR_FROM,
            explain=_explain_clear,
            options=(
                Option("include_downstream", "with downstream", "Also clear every downstream task that is finished, waiting or dead-lettered."),
                Option("keep_task_state", "keep the task state", "Keep the task state (and so the idempotency key); by default clearing empties it."),
            ),
        ),
        TaskAction(
            name="mark_success",
            label="Mark success",
            verb="mark success",
            past="Marked success",
            summary="Mark a task successful; its upstream_failed downstream tasks run again",
            done="Marked {task} success.",
            allowed_from=MARK_SUCCESS_FROM,
            explain=_explain_mark_success,
        ),
        TaskAction(
            name="mark_failed",
            label="Mark failed",
            verb="mark failed",
            past="Marked failed",
            summary="Mark a task failed, stopping it if it is queued or running",
            done="Marked {task} failed.",
            allowed_from=MARK_FAILED_FROM | ACTIVE_TASK_STATES,  # a queued or running task is stopped
            explain=_explain_mark_failed,
            danger=True,
        ),
        TaskAction(
            name="reclassify",
            label="Reclassify as platform failure",
            verb="reclassify",
            past="Reclassified",
            summary="Charge the task's last user failure to the platform and give its retry back",
            done="Reclassified the last failure of {task} as the platform's: that try repeats.",
            # Any state a worker does not hold; the action also needs a user-charged failed attempt.
            allowed_from=frozenset(TaskState) - ACTIVE_TASK_STATES,
            explain=_explain_reclassify,
        ),
    )
}

# What a mapped task's page offers on many of its instances, in the order it shows them.
MAPPED_TASK_OFFERS: tuple[BulkOffer, ...] = (
    BulkOffer("clear", "all", "Clear all {n}", "Every one of the {n} instances that is finished runs again with a fresh set of tries."),
    BulkOffer("clear", "failed", "Clear the {f} failed", "The {f} failed or dead-lettered instances run again with a fresh set of tries."),
    BulkOffer("reclassify", "failed", "Reclassify the {f} failed",
              "Each failed instance's last user-charged failure is charged to the platform; its try is given back."),
    BulkOffer("mark_success", "failed", "Mark the {f} failed success",
              "The failed instances are recorded as succeeded (with a null result) without running."),
    BulkOffer("mark_success", "all", "Mark all {n} success", "Every instance that has not succeeded is recorded as succeeded without running."),
    BulkOffer("mark_failed", "all", "Mark all {n} failed",
              "Every instance is recorded as failed and not retried; queued and running ones are stopped."),
)  # fmt: skip

# What a run's page offers on its failed tasks (their upstream_failed downstream tasks follow).
RUN_OFFERS: tuple[BulkOffer, ...] = (
    BulkOffer("clear", "failed", "Clear all failed", "every failed task of this run runs again with a fresh set of tries,"
              " and the tasks that were upstream_failed because of them run after them."),
)  # fmt: skip

# What the dead letters' page offers on each group of dead letters (`{n}` of them).
DEAD_LETTER_OFFERS: tuple[BulkOffer, ...] = (
    BulkOffer("clear", "group", "Clear all {n}", "each of these {n} task instances runs again with a fresh set of tries;"
              " their upstream_failed downstream tasks run after them."),
    BulkOffer("mark_failed", "group", "Mark all {n} failed", "each of these {n} task instances is recorded as failed and not"
              " retried; their runs end failed unless other tasks decide otherwise."),
)  # fmt: skip

APPROVAL_NOTE = "Why: kept with the decision and in the audit log."
APPROVAL_ACTIONS: dict[str, ApprovalAction] = {
    action.name: action
    for action in (
        ApprovalAction(
            name="approve",
            label="Approve",
            summary="Approve a task waiting for an approval: it succeeds with {approved_by, note}",
            explanation="the task succeeds and its downstream tasks run.",
            done="approved {task}",
            approves=True,
        ),
        ApprovalAction(
            name="reject",
            label="Reject",
            summary="Reject a task waiting for an approval: it fails as user_action/rejected, not retried",
            explanation="the task fails (user_action/rejected) and is not retried.",
            done="rejected {task}",
            approves=False,
            danger=True,
        ),
    )
}


def _explain_cancel(pending: int) -> str:
    runs, start = ("run", "starts") if pending == 1 else ("runs", "start")
    return f"the {pending} {runs} not started never {start}; the running ones finish."


BACKFILL_ACTIONS: dict[str, BackfillAction] = {
    action.name: action
    for action in (
        BackfillAction(
            name="pause",
            label="Pause",
            summary="Pause: none of its runs starts until it is unpaused (running ones go on)",
            allowed_from=frozenset({Backfill.State.RUNNING}),
        ),
        BackfillAction(
            name="unpause",
            label="Unpause",
            summary="Unpause: its runs start again on the scheduler's next pass",
            allowed_from=frozenset({Backfill.State.PAUSED}),
        ),
        BackfillAction(
            name="cancel",
            label="Cancel",
            summary="Cancel: its runs not started never start; running ones finish",
            allowed_from=frozenset({Backfill.State.RUNNING, Backfill.State.PAUSED}),
            explain=_explain_cancel,
            danger=True,
        ),
    )
}

CIRCUIT_NOTE = "Why: kept in the audit log."
CIRCUIT_ACTIONS: dict[str, CircuitAction] = {
    action.name: action
    for action in (
        CircuitAction("open", "Open the circuit now: hold its tasks until a probe succeeds or it is closed"),
        CircuitAction("close", "Close the circuit now: its held tasks are released over its ramp"),
        CircuitAction("probe", "Let one task through as a probe now, without waiting for the cool-down"),
    )
}

DAG_ACTIONS: dict[str, DagAction] = {
    action.name: action
    for action in (
        DagAction("trigger", "Trigger run", "Trigger a run of the selected DAGs", TRIGGER_PERMISSION),
        DagAction("pause", "Pause", "Pause the selected DAGs", PAUSE_PERMISSION),
        DagAction("unpause", "Unpause", "Unpause the selected DAGs", PAUSE_PERMISSION),
    )
}
