"""A DAG's edges as a report needs them: which tasks wait for a given one.

Read once per version of the DAG (its `updated_at`) and kept in the process: a report looks up
the downstream of the task that ended instead of reading the run's every task. An edit whose
version the cache misses only delays a downstream task to the scheduler's next pass, which
reads the definitions themselves.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime

from orchestrator.models import Dag, Task


@dataclass(frozen=True)
class DagGraph:
    downstream: dict[str, tuple[str, ...]]  # task_id -> the tasks that list it as an upstream
    upstream: dict[str, frozenset[str]]  # task_id -> its upstream tasks
    trigger_rule: dict[str, str]
    # The tasks that run no process but wait (`wait_for`): their dispatch begins their wait.
    wait_tasks: frozenset[str] = frozenset()

    @functools.cached_property
    def upstream_task_ids(self) -> frozenset[str]:
        """The tasks some other task waits for (built once: every report of a 10,000-task
        fan-in asks, and building it each time cost the report time in the width)."""
        return frozenset(self.downstream)


def dag_graph(dag: Dag) -> DagGraph:
    return graph_of(dag.pk, dag.updated_at)


@functools.lru_cache(maxsize=256)
def graph_of(dag_pk: int, version: datetime) -> DagGraph:
    downstream: dict[str, list[str]] = {}
    upstream_of: dict[str, frozenset[str]] = {}
    rules: dict[str, str] = {}
    waits: set[str] = set()
    rows = Task.objects.filter(dag_id=dag_pk).values_list("task_id", "upstream", "trigger_rule", "wait_for")
    for task_id, upstream, rule, wait_for in rows:
        upstream_of[task_id], rules[task_id] = frozenset(upstream or []), rule
        if wait_for:
            waits.add(task_id)
        for name in upstream or []:
            downstream.setdefault(name, []).append(task_id)
    return DagGraph({name: tuple(tasks) for name, tasks in downstream.items()}, upstream_of, rules, frozenset(waits))
