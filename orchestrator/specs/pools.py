"""The one spec check that needs the database: every pool a task names must exist."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from orchestrator.models import Pool
from orchestrator.specs.errors import Problem


def known_pools() -> set[str]:
    return set(Pool.objects.values_list("name", flat=True))


def unknown_pool_problems(tasks: Iterable[dict[str, Any]], known: set[str] | None = None) -> list[Problem]:
    """A problem per task whose `pool` is not a pool made with set_pool; `tasks` are spec entries."""
    known = known_pools() if known is None else known
    problems = []
    for i, task in enumerate(tasks):
        pool = (task.get("args") or {}).get("pool", task.get("pool"))
        if isinstance(pool, str) and pool not in known:
            problems.append(
                Problem(
                    f"tasks[{i}].pool",
                    f"task {task.get('task_id')!r}: unknown pool {pool!r} (create it with: manage.py set_pool {pool} SLOTS)",
                )
            )
    return problems


def default_pool_problems(default_args: dict[str, Any] | None, known: set[str] | None = None) -> list[Problem]:
    """A problem if the DAG's default_args name a pool that does not exist."""
    pool = (default_args or {}).get("pool")
    if not isinstance(pool, str):
        return []
    known = known_pools() if known is None else known
    if pool in known:
        return []
    return [Problem("default_args.pool", f"unknown pool {pool!r} (create it with: manage.py set_pool {pool} SLOTS)")]


def spec_pool_problems(spec: dict[str, Any], known: set[str] | None = None) -> list[Problem]:
    """Every unknown pool a validated DAG spec names, in its default_args or its tasks."""
    known = known_pools() if known is None else known
    return default_pool_problems(spec.get("default_args"), known) + unknown_pool_problems(spec.get("tasks") or [], known)
