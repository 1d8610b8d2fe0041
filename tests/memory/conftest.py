"""Fixtures for the memory limit tests: real workers, in either mode, and the cgroups they make.

The cgroup mode needs a memory cgroup this process may make children in (root, or a delegated
subtree): where there is none, its tests skip and the watched mode is still tested."""
from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.worker.host.memory import CGROUP, WATCHED, Hierarchy, MemoryLimits, MemoryLimitsUnavailable
from tests.worker.conftest import make_dag, queue_name, scheduler_settings, worker  # noqa: F401  fixtures reused here


def cgroups_usable() -> str | None:
    """None when this machine lets a worker make memory cgroups here; else why not."""
    try:
        limits = MemoryLimits.start(CGROUP)
    except MemoryLimitsUnavailable as exc:
        return str(exc)
    limits.close()
    return None


@pytest.fixture(params=[CGROUP, WATCHED])
def mode(request) -> str:
    """Each test that takes it runs once per way of enforcing limits."""
    if request.param == CGROUP and (why := cgroups_usable()) is not None:
        pytest.skip(f"no memory cgroups here: {why}")
    return request.param


@pytest.fixture
def cgroup_root() -> Path:
    """Where this process's workers make their cgroups (their own memory cgroup is ours)."""
    if (why := cgroups_usable()) is not None:
        pytest.skip(f"no memory cgroups here: {why}")
    hierarchy = Hierarchy.find()
    assert hierarchy is not None
    return hierarchy.own


@pytest.fixture
def worker_on(spawn, scheduler_settings) -> Iterator[Callable[..., subprocess.Popen]]:  # noqa: F811
    """Start `run_worker QUEUE` with settings of its own; its log is printed when the test fails."""
    logs: list[tuple[int, list[str]]] = []

    def start(queue: str, **env: Any) -> subprocess.Popen:
        merged = {"ORCHESTRATOR_HEARTBEAT_INTERVAL": "0.2", **{k: str(v) for k, v in env.items()}}
        proc = spawn("run_worker", queue, env=merged)
        lines: list[str] = []
        logs.append((proc.pid, lines))
        proc.log_lines = lines  # type: ignore[attr-defined]
        threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
        return proc

    yield start
    for pid, lines in logs:
        print(f"--- worker {pid} ---\n{''.join(lines)}")
