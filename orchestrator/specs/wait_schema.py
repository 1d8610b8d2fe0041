"""A task's `wait_for`: exactly one kind, each checked as the spec's other fields are.

    wait_for: {time: "2026-12-01T06:00:00"}              # ISO 8601; naive = the DAG's timezone
    wait_for: {time_after_logical_date: 3600}             # seconds
    wait_for: {dag_run: {dag_id: other, task_id: publish, offset: 0}}
    wait_for: {http: {url: "https://partner.example/ready", status: 200, contains: "ready"}}
    wait_for: {event: {name: orders_landed}}
    wait_for: {approval: {message: "Publish?", approvers: [finance]}}

Pure apart from reading ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS: whether a `dag_run`'s DAG exists is
the importer's question, and only a warning (`dag_run_warnings`): DAGs are imported in any order.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any
from zoneinfo import ZoneInfo

from deadlines.notifiers import NotifierError, allowed_host
from orchestrator.specs.value_checks import IDENTIFIER, Problems, is_int, join, parse_datetime, show, unknown_keys
from retries.states import SPEC_WAIT_KINDS, WaitFor

_KEYS = {
    WaitFor.DAG_RUN: ("dag_id", "task_id", "offset"),
    WaitFor.HTTP: ("url", "status", "contains"),
    WaitFor.EVENT: ("name",),
    WaitFor.APPROVAL: ("message", "approvers"),
}
EVENT_NAME_CHARS = 250


def check_wait_for(value: object, prefix: str, tz: ZoneInfo, problems: Problems) -> dict[str, Any] | None:
    """The task's `wait_for` normalised ({KIND: spec}), or None when it has none. Problems name
    the field: `tasks[2].wait_for.http.url`."""
    if value is None:
        return None
    path = join(prefix, "wait_for")
    if not isinstance(value, Mapping) or len(value) != 1:
        problems.add(path, f"must be a mapping with exactly one of {', '.join(SPEC_WAIT_KINDS)}; not {show(value)}")
        return None
    ((kind, spec),) = value.items()
    if kind not in SPEC_WAIT_KINDS:
        problems.add(path, f"unknown kind {show(kind)}: use one of {', '.join(SPEC_WAIT_KINDS)}")
        return None
    where = join(path, kind)
    if kind == WaitFor.TIME:
        try:
            parse_datetime(spec, tz)
        except ValueError as exc:
            problems.add(where, str(exc))
        return {kind: spec}
    if kind == WaitFor.TIME_AFTER_LOGICAL_DATE:
        if isinstance(spec, bool) or not isinstance(spec, (int, float)) or not math.isfinite(spec):
            problems.add(where, f"must be a number of seconds, not {show(spec)}")
        return {kind: spec}
    if not isinstance(spec, Mapping):
        problems.add(where, f"must be a mapping, not {show(spec)}")
        return None
    unknown_keys(spec, _KEYS[WaitFor(kind)], where, problems)
    _CHECKS[WaitFor(kind)](spec, where, problems)
    return {kind: dict(spec)}


def _dag_run(spec: Mapping, where: str, problems: Problems) -> None:
    dag_id = spec.get("dag_id")
    if not isinstance(dag_id, str) or not IDENTIFIER.match(dag_id):
        problems.add(join(where, "dag_id"), f"must be a DAG id, not {show(dag_id)}")
    task_id = spec.get("task_id")
    if task_id is not None and (not isinstance(task_id, str) or not IDENTIFIER.match(task_id)):
        problems.add(join(where, "task_id"), f"must be a task id, not {show(task_id)}")
    offset = spec.get("offset", 0)
    if isinstance(offset, bool) or not isinstance(offset, (int, float)) or not math.isfinite(offset):
        problems.add(join(where, "offset"), f"must be a number of seconds, not {show(offset)}")


def _http(spec: Mapping, where: str, problems: Problems) -> None:
    url = spec.get("url")
    try:
        allowed_host(url if isinstance(url, str) else "")
    except NotifierError as exc:
        text = str(exc).replace("notifier:webhook needs callback_kwargs.url, an http(s) URL", "must be an http(s) URL")
        problems.add(join(where, "url"), text.replace("webhook host", "host"))
    status = spec.get("status", 200)
    if not is_int(status) or not 100 <= status <= 599:
        problems.add(join(where, "status"), f"must be an HTTP status (100-599), not {show(status)}")
    contains = spec.get("contains")
    if contains is not None and (not isinstance(contains, str) or not contains):
        problems.add(join(where, "contains"), f"must be a non-empty string, not {show(contains)}")


def _event(spec: Mapping, where: str, problems: Problems) -> None:
    name = spec.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > EVENT_NAME_CHARS:
        problems.add(join(where, "name"), f"must be a name of 1-{EVENT_NAME_CHARS} characters, not {show(name)}")


def _approval(spec: Mapping, where: str, problems: Problems) -> None:
    message = spec.get("message", "")
    if not isinstance(message, str):
        problems.add(join(where, "message"), f"must be a string, not {show(message)}")
    approvers = spec.get("approvers", [])
    if not isinstance(approvers, list) or not all(isinstance(group, str) and group for group in approvers):
        problems.add(join(where, "approvers"), f"must be a list of group names, not {show(approvers)}")


_CHECKS = {WaitFor.DAG_RUN: _dag_run, WaitFor.HTTP: _http, WaitFor.EVENT: _event, WaitFor.APPROVAL: _approval}


def dag_run_warnings(spec: dict[str, Any], known_dag_ids: set[str]) -> list[str]:
    """A `dag_run` wait naming a DAG that is not defined (yet): a warning, not an error."""
    warnings = []
    for task in spec.get("tasks", []):
        awaited = (task.get("wait_for") or {}).get(WaitFor.DAG_RUN)
        if isinstance(awaited, Mapping) and awaited.get("dag_id") not in known_dag_ids:
            warnings.append(
                f"task {task['task_id']!r}: wait_for.dag_run.dag_id: DAG {awaited.get('dag_id')!r} is not defined (yet);"
                " the task waits until a run of it succeeds"
            )
    return warnings
