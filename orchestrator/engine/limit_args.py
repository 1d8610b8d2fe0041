"""A task's limit keys (pool, pool_slots, priority_weight, max_active_tis_per_dag,
max_active_tis_per_dagrun, circuit):
their defaults and how they are read from the task's `args`. No database."""
from __future__ import annotations

from typing import Any

# Per-task keys that protect what the task calls; kept in the task's `args` with its overrides.
LIMIT_KEYS = ("pool", "pool_slots", "priority_weight", "max_active_tis_per_dag", "max_active_tis_per_dagrun", "circuit")
LIMIT_DEFAULTS: dict[str, Any] = {
    "pool": None,
    "pool_slots": 1,
    "priority_weight": 1,
    "max_active_tis_per_dag": None,
    # A mapped task's instances running at once in one run.
    "max_active_tis_per_dagrun": None,
    "circuit": None,
}


def limit_args(task_args: dict[str, Any] | None, dag_default_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """The task's limit keys: its own (`task_args` is Task.args), else the DAG's default_args,
    else the defaults."""
    args = {**(dag_default_args or {}), **(task_args or {})}
    return {key: args.get(key, default) for key, default in LIMIT_DEFAULTS.items()}
