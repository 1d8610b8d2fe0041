"""The operator actions as the pages offer them: one button (`ActionChoice`) per action a task
allows now, with its label, its explanation and its options as `orchestrator.operations.action_registry`
declares them; one (`BulkChoice`) per action a page offers on many task instances at once.

Which actions a task allows, and whether the operator may act at all, is not decided here: the
view asks `orchestrator.operations.actions` and passes the answer in (`Operator`), so a page offers exactly
what the action would accept.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.models import DagRun, TaskInstance
from orchestrator.operations.action_registry import TASK_ACTIONS, BulkOffer, Option


@dataclass(frozen=True)
class Operator:
    """What the person looking at a page may do, as `orchestrator.operations.actions` decides it."""

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
    options: tuple[Option, ...] = ()  # its checkboxes
    map_index: int | None = None  # a mapped task's instance this acts on


def _offered(option: Option, downstream: list[TaskInstance] | None) -> bool:
    """On the task page every option, `include_downstream` only when there are downstream tasks;
    on the run page's rows (`downstream` None) only `include_downstream`."""
    if option.name == "include_downstream":
        return downstream is None or bool(downstream)
    return downstream is not None


def choice(name: str, url: str, ti: TaskInstance, downstream: list[TaskInstance] | None = None) -> ActionChoice:
    """The button for action `name` on `ti`. `downstream`: the tasks downstream of it, on the
    task page (which spells out what happens to them); None on the run page's rows."""
    action = TASK_ACTIONS[name]
    return ActionChoice(
        name, action.label, url, action.explain(ti, downstream), danger=action.danger,
        options=tuple(option for option in action.options if _offered(option, downstream)),
        map_index=ti.map_index if ti.map_index >= 0 else None,
    )  # fmt: skip


@dataclass(frozen=True)
class BulkChoice:
    """A task action offered on many task instances at once, its counts filled in."""

    name: str
    label: str
    url: str
    explanation: str
    scope: str
    danger: bool
    action_label: str  # the task action's own label


def bulk_choice(offer: BulkOffer, url: str, *, n: int = 0, f: int = 0) -> BulkChoice:
    """`offer` as a page shows it: `n` instances, `f` of them failed."""
    action = TASK_ACTIONS[offer.action]
    label, explanation = offer.label.format(n=n, f=f), offer.explanation.format(n=n, f=f)
    return BulkChoice(offer.action, label, url, explanation, offer.scope, action.danger, action.label)
