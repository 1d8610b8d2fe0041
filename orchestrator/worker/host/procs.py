"""Process-group plumbing for the supervisor: signal a group, see who is left, reap them.

The watchdog that kills every task group when the worker dies is the fork server (forkserver.py).
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable, Iterator

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
# Loaded once: `become_dumpable` runs in every task process a non-root fork server forks.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def become_subreaper() -> bool:
    """Orphaned descendants (a task's bash children) become our children, so we can reap them."""
    return _LIBC is not None and _LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def become_undumpable() -> bool:
    """Make /proc/<pid>/environ and the process's memory readable only by root, so a task running
    under the same user cannot read the worker's secrets there (root still can)."""
    return _set_dumpable(0)


def become_dumpable() -> bool:
    """Undo `become_undumpable` for this process: its user's processes may read its /proc files
    (smaps_rollup among them) again."""
    return _set_dumpable(1)


def _set_dumpable(flag: int) -> bool:
    return _LIBC is not None and _LIBC.prctl(PR_SET_DUMPABLE, flag, 0, 0, 0) == 0


def _process_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/<pid>/stat after the command name) of every process, skipping
    those that end while they are read; nothing where /proc cannot be read."""
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                text = stat.read().decode(errors="replace")
        except OSError:
            continue
        # The command name is in parentheses and may itself hold spaces or parentheses.
        yield int(entry.name), text[text.rfind(")") + 2 :].split()


def zombie_children(parent: int) -> list[int]:
    """Children of `parent` that have ended and wait to be reaped."""
    return [pid for pid, fields in _process_stats() if len(fields) > 1 and fields[0] == "Z" and int(fields[1]) == parent]


def reap_orphans(keep: set[int]) -> int:
    """Reap every ended child of ours but those in `keep` (children a Popen waits for): as a
    child subreaper we inherit whatever a task left behind, even a grandchild that called
    setsid() and so left the task's group. Returns how many were reaped."""
    reaped = 0
    for pid in zombie_children(os.getpid()):
        if pid in keep:
            continue
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped += 1
        except ChildProcessError:
            pass
    return reaped


def reap_orphans_forever(keep: Callable[[], set[int]], stop: threading.Event, interval: float = 1.0) -> None:
    """The worker's reaping loop."""
    while not stop.wait(interval):
        try:
            reap_orphans(keep())
        except Exception:  # never let the reaper die of one odd /proc entry
            pass


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to the whole group; False if no process of it is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_members(pgid: int) -> list[int]:
    """Processes of the group that are still running (zombies are dead and not counted)."""
    if not os.path.isdir("/proc"):
        return [pgid] if signal_group(pgid, 0) else []
    return [pid for pid, fields in _process_stats() if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X")]


def reap_group(pgid: int) -> bool:
    """Collect every child of ours in the group that has ended; True when none is left."""
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False


def pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` exits (Linux 5.3+), to wake the loop at once."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return opener(pid)
    except OSError:
        return None

