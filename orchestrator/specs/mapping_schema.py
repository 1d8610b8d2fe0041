"""Validation of what a task reads from other tasks: `expand` (a mapped task's source) and the
templates of a bash command. Both may name only a direct upstream, and a template may not stand
where the shell would not expand it (`orchestrator/foundation/templating.py`).

Called by `schema._validate_task` for files and the admin alike; the limit on a literal list is
`ORCHESTRATOR_MAX_MAP_LENGTH`, read at call time.
"""
from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from django.conf import settings

from orchestrator.engine.mapping import RESULTS_PREFIX
from orchestrator.foundation.templating import CONTEXT_NAMES, quoting_problems, result_references
from orchestrator.specs.value_checks import Problems, join, show

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_expand(
    raw: object, upstream: list[str], op_kwargs: Mapping[str, Any], prefix: str, problems: Problems
) -> dict[str, Any] | None:
    """`expand: {NAME: SOURCE}` normalised (None: not mapped); every problem added under `prefix.expand`."""
    path = join(prefix, "expand")
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not raw:
        problems.add(path, f"must be a mapping of one name to its source, e.g. {{path: results.extract}}; not {show(raw)}")
        return None
    if len(raw) != 1:
        problems.add(path, f"must have exactly one name, not {len(raw)}: {', '.join(map(str, raw))}")
        return None
    ((name, source),) = raw.items()
    if not isinstance(name, str) or not _NAME.match(name):
        problems.add(path, f"name {show(name)} must be a Python identifier (letters, digits, '_')")
    elif name in CONTEXT_NAMES:
        problems.add(path, f"name {name!r} is a context name; choose another ({', '.join(sorted(CONTEXT_NAMES))} are taken)")
    elif name in op_kwargs:
        problems.add(path, f"name {name!r} is also a key of op_kwargs; each instance gets its item under that name")
    source_path = join(path, str(name))
    if isinstance(source, list):
        limit = int(settings.ORCHESTRATOR_MAX_MAP_LENGTH)
        if len(source) > limit:
            problems.add(source_path, f"has {len(source)} items, over ORCHESTRATOR_MAX_MAP_LENGTH={limit}")
    elif isinstance(source, str) and source.startswith(RESULTS_PREFIX):
        task_id = source[len(RESULTS_PREFIX) :]
        if task_id not in upstream:
            problems.add(source_path, f"{source!r} names {task_id!r}, which is not a direct upstream of this task (upstream: {upstream})")
    else:
        problems.add(source_path, f"must be a list, or results.TASK_ID naming a direct upstream; not {show(source)}")
    return {name: source}


def check_templates(
    bash_command: str, upstream: list[str], prefix: str, problems: Problems, mapped_names: Collection[str] = (), task_id: object = None
) -> None:
    """Every `{{ results.TASK_ID[.KEY] }}` of a bash command must name a direct upstream, and no
    substitution may stand where the shell expands nothing (single quotes, `$'...'`, a quoted
    here-document): its value could not reach the command there."""
    path = join(prefix, "bash_command")
    for reference in result_references(bash_command, upstream):
        if reference.task_id is None:
            problems.add(path, f"{reference.text} does not name a direct upstream of this task (upstream: {upstream})")
    task = f"task {task_id!r}: " if isinstance(task_id, str) else ""
    for problem in quoting_problems(bash_command, mapped_names):
        problems.add(path, task + problem)
