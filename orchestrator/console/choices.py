"""The operator actions as the pages offer them: one button (`ActionChoice`) per action a task
allows now, and the confirmation read after one.

Which actions a task allows, and whether the operator may act at all, is not decided here: the
view asks `orchestrator.actions` and passes the answer in (`Operator`), so a page offers exactly
what the action would accept.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.models import DagRun, TaskInstance

LABELS = {
    "clear": "Clear",
    "mark_success": "Mark success",
    "mark_failed": "Mark failed",
    "reclassify": "Reclassify as platform failure",
}

DONE = {
    "clear": "Cleared {task}: it runs again with a fresh set of tries.",
    "mark_success": "Marked {task} success.",
    "mark_failed": "Marked {task} failed.",
    "reclassify": "Reclassified the last failure of {task} as the platform's: that try repeats.",
}


@dataclass(frozen=True)
class Operator:
    """What the person looking at a page may do, as `orchestrator.actions` decides it."""

    may_act: bool
    # the actions each task instance allows now, by primary key (empty when may_act is false)
    allowed: Callable[[Sequence[TaskInstance]], Mapping[int, Sequence[str]]]
    # every task of the instance's run downstream of it (what an action may touch)
    downstream: Callable[[TaskInstance], list[TaskInstance]]
    # a mapped task's instances (run, task_id): the actions an instance in each state allows
    # now, by state (one query, whatever the number of instances)
    allowed_by_state: Callable[[DagRun, str], Mapping[str, Sequence[str]]]


@dataclass(frozen=True)
class ActionChoice:
    """One action offered on a page, with what it will do in words."""

    name: str
    label: str
    url: str
    explanation: str
    danger: bool = False
    downstream_option: bool = False
    map_index: int | None = None  # a mapped task's instance this acts on
    task_state_option: bool = False  # clear: offer to keep the task state


def choice(name: str, url: str, explanation: str, ti: TaskInstance, **options: bool) -> ActionChoice:
    """The button for action `name` on `ti` (mark failed is the dangerous one)."""
    return ActionChoice(
        name, LABELS[name], url, explanation, danger=name == "mark_failed",
        map_index=ti.map_index if ti.map_index >= 0 else None, **options,
    )  # fmt: skip


def action_done(action: str, task: str, note: str) -> str:
    """The confirmation an operator reads after one action on one task."""
    text = DONE[action].format(task=task)
    return f"{text} Noted: “{note}”." if note else text
