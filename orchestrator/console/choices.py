"""The operator actions as the pages offer them: one button (`ActionChoice`) per action a task
allows now, with its label, its explanation and its options as `orchestrator.action_registry`
declares them.

Which actions a task allows, and whether the operator may act at all, is not decided here: the
view asks `orchestrator.actions` and passes the answer in (`Operator`), so a page offers exactly
what the action would accept.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.action_registry import TASK_ACTIONS
from orchestrator.models import DagRun, TaskInstance


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


def choice(name: str, url: str, ti: TaskInstance, downstream: list[TaskInstance] | None = None) -> ActionChoice:
    """The button for action `name` on `ti`. `downstream`: the tasks downstream of it, on the
    task page (which spells out what happens to them, and offers "with downstream" only when
    there are some); None on the run page's rows (which offer it always, and no other option)."""
    action = TASK_ACTIONS[name]
    with_downstream = action.takes("include_downstream") and (downstream is None or bool(downstream))
    return ActionChoice(
        name, action.label, url, action.explain(ti, downstream), danger=action.danger,
        downstream_option=with_downstream, map_index=ti.map_index if ti.map_index >= 0 else None,
        task_state_option=downstream is not None and action.takes("keep_task_state"),
    )  # fmt: skip
