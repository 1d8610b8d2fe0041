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
