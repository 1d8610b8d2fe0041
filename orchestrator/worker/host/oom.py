"""The kernel's OOM-kill counter for this process's memory cgroup, when it can be read.

A task process killed by SIGKILL that the supervisor did not send is most likely the OOM
killer; a counter that grew during the attempt says so for certain.
"""
from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def oom_kill_count(pid: int | str = "self") -> int | None:
    """The `oom_kill` count of the memory cgroup of `pid` (cgroup v2 or v1), or None."""
    for path in _candidates(pid):
        count = _read_oom_kill(path)
        if count is not None:
            return count
    return None


def _candidates(pid: int | str) -> list[Path]:
    paths: list[Path] = []
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, group = rest.partition(":")
        group = group.lstrip("/")
        if hierarchy == "0" and controllers == "":
            paths.append(CGROUP_ROOT / group / "memory.events")  # v2 unified
        elif "memory" in controllers.split(","):
            paths.append(CGROUP_ROOT / "memory" / group / "memory.oom_control")  # v1
    paths += [CGROUP_ROOT / "memory.events", CGROUP_ROOT / "memory" / "memory.oom_control"]
    return paths


def _read_oom_kill(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            try:
                return int(value.strip())
            except ValueError:
                return None
    return None
