"""Bash templates: `{{ name }}` replaced by a context value, an upstream's result, a conf key or
a mapped instance's item. Pure (no Django): the task process, the worker and the spec
validation all use it, so what is validated at import is what is rendered at run time.

    {{ dag_id }} {{ task_id }} {{ run_id }} {{ logical_date }} {{ try_number }}
    {{ infrastructure_try_number }} {{ map_index }}      the context's values
    {{ results.TASK_ID }}                                a direct upstream's result
    {{ results.TASK_ID.KEY }}                            a key of a dict result
    {{ conf.KEY }}                                       a key of the run's conf
    {{ NAME }}                                           a mapped instance's item (expand: {NAME: ...})

A string is inserted as it is, anything else as JSON; a missing key or result inserts nothing.
Anything else between braces is left as written. Values are inserted as they are, not quoted
for the shell: quote them in the command where they may hold spaces or quotes.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

TEMPLATE_NAMES = ("dag_id", "task_id", "run_id", "logical_date", "try_number", "infrastructure_try_number", "map_index")
# Names a task's context has (or may have): a mapped task's NAME may not be one of them.
CONTEXT_NAMES = frozenset(
    {*TEMPLATE_NAMES, "conf", "results", "task_state", "idempotency_key", "context", "params", "ti"}
)
_TEMPLATE = re.compile(r"\{\{\s*([A-Za-z_][^\s{}]*)\s*\}\}")


@dataclass(frozen=True)
class ResultReference:
    """`{{ results.TASK_ID[.KEY] }}` as written, resolved against the task's upstreams."""

    text: str
    task_id: str | None  # None: no upstream matches
    key: str | None


def result_path(path: str, upstream_ids: Iterable[str]) -> tuple[str, str | None] | None:
    """(task_id, key or None) for the part after `results.`; None when no upstream matches.

    Task ids may hold dots, so the longest upstream id that the path starts with wins.
    """
    ids = set(upstream_ids)
    if path in ids:
        return path, None
    for task_id in sorted(ids, key=len, reverse=True):
        if path.startswith(task_id + ".") and len(path) > len(task_id) + 1:
            return task_id, path[len(task_id) + 1 :]
    return None


def result_references(command: str, upstream_ids: Iterable[str]) -> list[ResultReference]:
    """Every `{{ results.… }}` of a command, resolved (for validation at import)."""
    ids = list(upstream_ids)
    found = []
    for match in _TEMPLATE.finditer(command):
        name = match.group(1)
        if name == "results" or name.startswith("results."):
            resolved = result_path(name[len("results.") :], ids) if name != "results" else None
            found.append(ResultReference(match.group(0), *(resolved or (None, None))))
    return found


def as_text(value: Any) -> str:
    """A string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render(command: str, context: Mapping[str, Any], mapped: Mapping[str, Any] | None = None) -> str:
    """Replace each template the command uses; other text is left as written."""
    mapped = mapped or {}
    results = context.get("results") or {}
    conf = context.get("conf") or {}

    def value(match: re.Match) -> str:
        name = match.group(1)
        if name in mapped:
            return as_text(mapped[name])
        if name in TEMPLATE_NAMES and name in context:
            return str(context[name])
        if name.startswith("results."):
            resolved = result_path(name[len("results.") :], results.keys())
            if resolved is None:
                return ""
            result = results[resolved[0]]
            if resolved[1] is None:
                return as_text(result)
            return as_text(result[resolved[1]]) if isinstance(result, Mapping) and resolved[1] in result else ""
        if name.startswith("conf."):
            key = name[len("conf.") :]
            return as_text(conf[key]) if isinstance(conf, Mapping) and key in conf else ""
        return match.group(0)

    return _TEMPLATE.sub(value, command)
