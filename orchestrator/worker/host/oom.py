"""The kernel's OOM-kill counter for this process's memory cgroup, when it can be read.

A task process killed by SIGKILL that the supervisor did not send is most likely the OOM
killer; a counter that grew during the attempt says so for certain. It is read before every
attempt, so each read is a few small files read as bytes.
"""
from __future__ import annotations

import functools
import os
import re

CGROUP_ROOT = "/sys/fs/cgroup"
_OOM_KILL = re.compile(rb"^oom_kill[ \t]+(\d+)", re.MULTILINE)


def oom_kill_count(pid: int | str = "self") -> int | None:
    """The `oom_kill` count of the memory cgroup of `pid` (cgroup v2 or v1), or None."""
    for path in _candidates(read_bytes(f"/proc/{pid}/cgroup")):
        count = oom_kill_in(read_bytes(path))
        if count is not None:
            return count
    return None


@functools.lru_cache(maxsize=16)
def _candidates(cgroups: bytes | None) -> tuple[str, ...]:
    """Where the counter may be, for a process whose /proc/PID/cgroup reads `cgroups` (a
    process that moves to another cgroup reads differently: looked up again)."""
    paths: list[str] = []
    for line in (cgroups or b"").decode(errors="replace").splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, group = rest.partition(":")
        group = group.lstrip("/")
        if hierarchy == "0" and controllers == "":
            paths.append(os.path.join(CGROUP_ROOT, group, "memory.events"))  # v2 unified
        elif "memory" in controllers.split(","):
            paths.append(os.path.join(CGROUP_ROOT, "memory", group, "memory.oom_control"))  # v1
    paths += [os.path.join(CGROUP_ROOT, "memory.events"), os.path.join(CGROUP_ROOT, "memory", "memory.oom_control")]
    return tuple(dict.fromkeys(paths))


def oom_kill_in(text: bytes | None) -> int | None:
    """The `oom_kill N` line of memory.events, memory.oom_control or /proc/vmstat."""
    found = _OOM_KILL.search(text) if text else None
    return int(found.group(1)) if found else None


def read_bytes(path: str) -> bytes | None:
    """A small kernel file's content, or None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
