"""Validation of one DAG spec into a normalised dict.

Pure apart from importing the callables the spec names and reading
`settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS`: no database. The file importer and the
admin forms both call `validate_dag`, so a DAG is held to the same rules wherever it is
written.

The normalised form (`DagSpec`, a plain dict):

    dag_id, description, schedule (str | None), timezone, start_date (aware | None),
    catchup, paused (bool | None: None = not given, keep what is stored), max_active_runs, owner ("" for none),
    max_active_tasks (int | None), params ({NAME: JSON Schema}), strict_params (bool),
    default_args (only the keys given: DEFAULT_ARG_KEYS), deadlines: [DeadlineSpec],
    tasks: [{task_id, python_callable, bash_command, op_kwargs, upstream, trigger_rule (its own, else
             default_args', else all_success), expand ({NAME: list | "results.TASK_ID"} | None),
             args (default_args keys and LIMIT_KEYS set on the task), deadlines: [DeadlineSpec]}]

Whether a task's pool exists is a database question: the importer and the admin forms ask
it (`orchestrator.specs.pools`), not this module.

    DeadlineSpec: reference, interval (float), datetime (aware | None), datetime_text,
    callback, callback_kwargs, warn, days, skip_dates (ISO date strings)
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from zoneinfo import ZoneInfo

from orchestrator.data.taskconfig import (
    ARG_KEYS,  # also the order the exporter writes them in
)
from orchestrator.engine.limit_args import LIMIT_KEYS
from orchestrator.foundation.sanitise import unstorable
from orchestrator.specs.deadline_schema import DeadlineSpec, validate_deadlines
from orchestrator.specs.errors import Problem
from orchestrator.specs.mapping_schema import check_expand, check_templates
from orchestrator.specs.params_schema import check_params
from orchestrator.specs.value_checks import (
    IDENTIFIER,
    Problems,
    check_args,
    check_callable,
    check_mapping,
    check_memory_together,
    check_schedule,
    check_timezone,
    is_int,
    join,
    parse_datetime,
    show,
    unknown_keys,
)
from orchestrator.specs.wait_schema import check_wait_for
from retries.states import TriggerRule

DagSpec = dict[str, Any]
# A DAG's owner: the team's name the alert rules route on.
OWNER = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")

DAG_KEYS = (
    "dag_id",
    "description",
    "schedule",
    "timezone",
    "start_date",
    "catchup",
    "paused",
    "max_active_runs",
    "owner",
    "max_active_tasks",
    "params",
    "strict_params",
    "default_args",
    "deadlines",
    "tasks",
)
TASK_KEYS = (
    "task_id",
    "python_callable",
    "bash_command",
    "wait_for",
    "op_kwargs",
    "upstream",
    "trigger_rule",
    "expand",
    "deadlines",
    *ARG_KEYS,
    *LIMIT_KEYS,
)

# A task's identity and shape: only the task itself can say these. Every other task key may
# also be given in default_args, with the same checks.
TASK_ONLY_KEYS = ("task_id", "python_callable", "bash_command", "wait_for", "op_kwargs", "upstream", "expand", "deadlines")
DEFAULT_ARG_KEYS = tuple(key for key in TASK_KEYS if key not in TASK_ONLY_KEYS)

DAG_DEFAULTS: dict[str, Any] = {
    "description": "",
    "schedule": None,
    "timezone": "UTC",
    "catchup": False,
    "max_active_runs": 16,
    "max_active_tasks": None,
    "strict_params": False,
}


def _validate_task(
    raw: object, prefix: str, tz: ZoneInfo, problems: Problems, default_trigger_rule: str = TriggerRule.ALL_SUCCESS.value
) -> dict[str, Any]:
    """One entry of `tasks:`; the graph as a whole is checked by `_check_graph`. A task that
    names no trigger_rule takes the DAG's default_args one (when valid), else all_success."""
    if not isinstance(raw, Mapping):
        problems.add(prefix, f"must be a mapping, not {show(raw)}")
        return {}
    unknown_keys(raw, TASK_KEYS, prefix, problems)
    task_id = raw.get("task_id")
    if not isinstance(task_id, str) or not IDENTIFIER.match(task_id):
        problems.add(join(prefix, "task_id"), f"must be 1-250 letters, digits, '_', '.' or '-'; not {show(task_id)}")

    python_callable = raw.get("python_callable") or ""
    bash_command = raw.get("bash_command") or ""
    wait_for = check_wait_for(raw.get("wait_for"), prefix, tz, problems)
    if sum(1 for given in (python_callable, bash_command, raw.get("wait_for") is not None) if given) > 1:
        problems.add(prefix, "set exactly one of python_callable or bash_command (or wait_for), not more")
    elif not python_callable and not bash_command and raw.get("wait_for") is None:
        problems.add(prefix, "set one of python_callable or bash_command (or wait_for)")
    elif python_callable:
        problem = check_callable(python_callable)
        if problem:
            problems.add(join(prefix, "python_callable"), problem)
    elif not isinstance(bash_command, str):
        problems.add(join(prefix, "bash_command"), f"must be a string, not {show(bash_command)}")

    upstream = raw.get("upstream") or []
    if not isinstance(upstream, list) or not all(isinstance(u, str) for u in upstream):
        problems.add(join(prefix, "upstream"), f"must be a list of task ids, not {show(upstream)}")
        upstream = []
    for name in {u for u in upstream if upstream.count(u) > 1}:
        problems.add(join(prefix, "upstream"), f"lists {name!r} more than once")

    trigger_rule = raw.get("trigger_rule", default_trigger_rule)
    _check_trigger_rule(trigger_rule, join(prefix, "trigger_rule"), problems)

    op_kwargs = check_mapping(raw.get("op_kwargs"), join(prefix, "op_kwargs"), problems, reserved=("context",))
    if isinstance(bash_command, str) and bash_command:
        expand = raw.get("expand")
        mapped_names = list(expand) if isinstance(expand, Mapping) else []
        check_templates(bash_command, upstream, prefix, problems, mapped_names=mapped_names, task_id=task_id)
    return {
        "task_id": task_id,
        "python_callable": python_callable if isinstance(python_callable, str) else "",
        "bash_command": bash_command if isinstance(bash_command, str) else "",
        "wait_for": wait_for,
        "op_kwargs": op_kwargs,
        "upstream": list(upstream),
        "trigger_rule": trigger_rule,
        "expand": check_expand(raw.get("expand"), upstream, op_kwargs, prefix, problems),
        "args": {**check_args(raw, ARG_KEYS, prefix, problems, task_id=task_id), **_check_limits(raw, prefix, problems)},
        "deadlines": validate_deadlines(
            raw.get("deadlines"), join(prefix, "deadlines"), task_level=True, tz=tz, problems=problems
        ),
    }


def _check_trigger_rule(value: object, path: str, problems: Problems) -> bool:
    if isinstance(value, str) and value in {rule.value for rule in TriggerRule}:
        return True
    rules = ", ".join(rule.value for rule in TriggerRule)
    problems.add(path, f"must be one of {rules}; not {show(value)}")
    return False


def _check_limits(raw: Mapping, prefix: str, problems: Problems) -> dict[str, Any]:
    """The LIMIT_KEYS present in `raw`, each checked (whether the pool exists is checked later)."""
    limits: dict[str, Any] = {}
    for key in LIMIT_KEYS:
        if key not in raw:
            continue
        value = limits[key] = raw[key]
        if key in ("pool", "circuit"):
            if value is not None and (not isinstance(value, str) or not IDENTIFIER.match(value)):
                problems.add(join(prefix, key), f"must be a name of 1-250 letters, digits, '_', '.' or '-', or null; not {show(value)}")
        elif key == "pool_slots":
            if not is_int(value) or value < 1:
                problems.add(join(prefix, key), f"must be a whole number >= 1, not {show(value)}")
        elif key == "priority_weight":
            if not is_int(value):
                problems.add(join(prefix, key), f"must be a whole number, not {show(value)}")
        elif key in ("max_active_tis_per_dag", "max_active_tis_per_dagrun"):
            if value is not None and (not is_int(value) or value < 1):
                problems.add(join(prefix, key), f"must be a whole number >= 1, or null for no limit; not {show(value)}")
    return limits


def _check_memory(default_args: dict[str, Any], tasks: list[dict[str, Any]], problems: Problems) -> None:
    """Each task's memory_limit_on_retry against its memory_limit, either of them its own or
    the DAG's default_args': named where the list is set, once."""
    if "memory_limit_on_retry" in default_args and not tasks:
        problem = check_memory_together(default_args)
        if problem:
            problems.add("default_args.memory_limit_on_retry", problem)
    seen: set[str] = set()
    for i, task in enumerate(tasks):
        args = {**default_args, **task.get("args", {})}
        problem = check_memory_together(args)
        if not problem:
            continue
        own = "memory_limit_on_retry" in task.get("args", {})
        path = f"tasks[{i}].memory_limit_on_retry" if own else "default_args.memory_limit_on_retry"
        if isinstance(task.get("task_id"), str):
            problem = f"task {task['task_id']!r}: {problem}"
        if path not in seen:
            seen.add(path)
            problems.add(path, problem)


def _index_of_task_ids(tasks: list[dict[str, Any]], problems: Problems) -> dict[str, int]:
    """Each task id's position in the list; a duplicate is a problem (the first one counts)."""
    index_of: dict[str, int] = {}
    for i, task in enumerate(tasks):
        task_id = task.get("task_id")
        if not isinstance(task_id, str):
            continue
        if task_id in index_of:
            problems.add(f"tasks[{i}].task_id", f"duplicate task id {task_id!r} (also tasks[{index_of[task_id]}])")
        else:
            index_of[task_id] = i
    return index_of


def _check_graph(tasks: list[dict[str, Any]], problems: Problems) -> None:
    """Duplicate task ids, unknown upstreams and cycles."""
    index_of = _index_of_task_ids(tasks, problems)
    for i, task in enumerate(tasks):
        for name in task.get("upstream", []):
            if name not in index_of:
                problems.add(f"tasks[{i}].upstream", f"unknown task {name!r}")
            elif name == task.get("task_id"):
                problems.add(f"tasks[{i}].upstream", f"task {name!r} cannot be its own upstream")

    # Depth-first search along upstream links; a link back into the current path is a cycle.
    upstream_of = {
        tid: [u for u in tasks[i].get("upstream", []) if u in index_of and u != tid] for tid, i in index_of.items()
    }
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    reported: set[frozenset[str]] = set()

    def visit(start: str) -> None:
        # Iterative, so a chain of thousands of tasks cannot exhaust Python's stack.
        path: list[str] = [start]
        state[start] = 1
        stack = [iter(upstream_of[start])]
        while stack:
            node = path[-1]
            parent = next(stack[-1], None)
            if parent is None:
                stack.pop()
                path.pop()
                state[node] = 2
                continue
            if state.get(parent) == 1:
                loop = path[path.index(parent) :]
                if frozenset(loop) not in reported:
                    reported.add(frozenset(loop))
                    # In running order: parent runs first, then the path back from `node`.
                    order = [parent, *reversed(loop[1:]), parent]
                    problems.add(f"tasks[{index_of[node]}].upstream", f"cycle: {' -> '.join(order)}")
            elif parent not in state:
                state[parent] = 1
                path.append(parent)
                stack.append(iter(upstream_of[parent]))

    for task_id in index_of:
        if task_id not in state:
            visit(task_id)


def _refuse_nul(value: object, path: str, problems: Problems) -> None:
    """The database cannot store a NUL character: name every string (or key) that holds one."""
    stack = [(value, path)]
    seen: set[int] = set()  # YAML aliases share objects: each is looked at once (no alias bomb)
    while stack:  # iterative: a deeply nested file must not exhaust the stack
        item, where = stack.pop()
        if isinstance(item, (Mapping, list, tuple)):
            if id(item) in seen:
                continue
            seen.add(id(item))
        if isinstance(item, str):
            if unstorable(item):
                problems.add(where, "must not contain the NUL character or a lone surrogate (\\ud800-\\udfff)")
        elif isinstance(item, Mapping):
            for key, child in item.items():
                if isinstance(key, str) and unstorable(key):
                    problems.add(where, f"has a key with the NUL character or a lone surrogate: {show(key)}")
                stack.append((child, join(where, str(key))))
        elif isinstance(item, (list, tuple)):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))


def _check_default_args(raw_args: object, problems: Problems) -> dict[str, Any]:
    """A DAG's default_args, each key checked."""
    if raw_args is not None and not isinstance(raw_args, Mapping):
        problems.add("default_args", f"must be a mapping, not {show(raw_args)}")
        return {}
    if not raw_args:
        return {}
    unknown_keys(raw_args, DEFAULT_ARG_KEYS, "default_args", problems)
    default_args = {**check_args(raw_args, ARG_KEYS, "default_args", problems), **_check_limits(raw_args, "default_args", problems)}
    if "trigger_rule" in raw_args and _check_trigger_rule(raw_args["trigger_rule"], "default_args.trigger_rule", problems):
        default_args["trigger_rule"] = raw_args["trigger_rule"]
    return default_args


def _check_tasks(raw_tasks: object, default_args: dict[str, Any], tz: ZoneInfo, problems: Problems) -> list[dict[str, Any]]:
    """A DAG's tasks, each checked, then their graph and their memory limits together."""
    if raw_tasks is None:
        return []
    if not isinstance(raw_tasks, list):
        problems.add("tasks", f"must be a list, not {show(raw_tasks)}")
        return []
    default_rule = default_args.get("trigger_rule", TriggerRule.ALL_SUCCESS.value)
    tasks = [_validate_task(item, f"tasks[{i}]", tz, problems, default_rule) for i, item in enumerate(raw_tasks)]
    _check_graph(tasks, problems)
    _check_memory(default_args, tasks, problems)
    return tasks


def validate_dag(raw: object) -> tuple[DagSpec, list[Problem]]:
    """Check one DAG spec; return its normalised form and every problem found.

    The normalised form is meaningful only when the list of problems is empty.
    """
    problems = Problems()
    if not isinstance(raw, Mapping):
        problems.add("", f"a DAG must be a mapping, not {show(raw)}")
        return {}, problems.items
    unknown_keys(raw, DAG_KEYS, "", problems)
    _refuse_nul(raw, "", problems)

    dag_id = raw.get("dag_id")
    if not isinstance(dag_id, str) or not IDENTIFIER.match(dag_id):
        problems.add("dag_id", f"must be 1-250 letters, digits, '_', '.' or '-'; not {show(dag_id)}")

    description = raw.get("description", "")
    if description is None:
        description = ""
    if not isinstance(description, str):
        problems.add("description", f"must be a string, not {show(description)}")

    schedule = raw.get("schedule")
    problem = check_schedule(schedule)
    if problem:
        problems.add("schedule", problem)

    timezone_name = raw.get("timezone", DAG_DEFAULTS["timezone"])
    problem = check_timezone(timezone_name)
    if problem:
        problems.add("timezone", problem)
    # With a bad timezone, keep checking the rest against UTC so every problem is reported.
    tz = ZoneInfo("UTC") if problem else ZoneInfo(timezone_name)

    start_date = None
    if raw.get("start_date") is not None:
        try:
            start_date, _ = parse_datetime(raw["start_date"], tz)
        except ValueError as exc:
            problems.add("start_date", str(exc))

    catchup = raw.get("catchup", DAG_DEFAULTS["catchup"])
    if not isinstance(catchup, bool):
        problems.add("catchup", f"must be true or false, not {show(catchup)}")
    # Not given (or null): an import keeps whatever an operator set.
    paused = raw.get("paused")
    if paused is not None and not isinstance(paused, bool):
        problems.add("paused", f"must be true or false, not {show(paused)}")

    max_active_runs = raw.get("max_active_runs", DAG_DEFAULTS["max_active_runs"])
    if not is_int(max_active_runs) or max_active_runs < 1:
        problems.add("max_active_runs", f"must be a whole number >= 1, not {show(max_active_runs)}")

    owner = raw.get("owner")
    owner = "" if owner is None else owner
    if not isinstance(owner, str) or (owner and not OWNER.match(owner)):
        problems.add("owner", f"must be 1-100 letters, digits, '_', '.' or '-', or null; not {show(owner)}")

    max_active_tasks = raw.get("max_active_tasks", DAG_DEFAULTS["max_active_tasks"])
    if max_active_tasks is not None and (not is_int(max_active_tasks) or max_active_tasks < 1):
        problems.add("max_active_tasks", f"must be a whole number >= 1, or null for no limit; not {show(max_active_tasks)}")

    params, strict_params = check_params(
        raw.get("params"), raw.get("strict_params", DAG_DEFAULTS["strict_params"]), schedule, problems
    )

    default_args = _check_default_args(raw.get("default_args"), problems)
    deadlines = validate_deadlines(raw.get("deadlines"), "deadlines", task_level=False, tz=tz, problems=problems)
    tasks = _check_tasks(raw.get("tasks"), default_args, tz, problems)

    spec: DagSpec = {
        "dag_id": dag_id,
        "description": description,
        "schedule": schedule,
        "timezone": timezone_name,
        "start_date": start_date,
        "catchup": catchup,
        "paused": paused,
        "max_active_runs": max_active_runs,
        "owner": owner,
        "max_active_tasks": max_active_tasks,
        "params": params,
        "strict_params": strict_params,
        "default_args": default_args,
        "deadlines": deadlines,
        "tasks": tasks,
    }
    return spec, problems.items


def validate_deadline_list(raw: object, *, task_level: bool, timezone: str) -> tuple[list[DeadlineSpec], list[Problem]]:
    """Check a `deadlines:` list on its own (the admin's deadline inlines); paths are `deadlines[i].field`.

    `timezone` is the DAG's; a bad one is reported by the DAG's own validation, so UTC stands in.
    """
    problems = Problems()
    tz = ZoneInfo("UTC") if check_timezone(timezone) else ZoneInfo(timezone)
    specs = validate_deadlines(raw, "deadlines", task_level=task_level, tz=tz, problems=problems)
    return specs, problems.items
