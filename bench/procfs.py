"""What /proc says about processes: their trees, memory (RSS, PSS) and CPU time. Linux only."""
from __future__ import annotations

import os


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name: [0] is the state, [1] the ppid."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def children(pid: int) -> list[int]:
    """`pid`'s child processes, from /proc/PID/task/*/children (no scan of all of /proc)."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                found.extend(int(p) for p in handle.read().split())
        except OSError:
            continue
    return found


def alive(pid: int) -> bool:
    """Running (not a zombie waiting to be reaped, not gone)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def subtree(pid: int) -> list[int]:
    """`pid`'s descendants (not itself), found through the children files."""
    found: list[int] = []
    todo = children(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children(child))
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def status_kib(pid: int, key: str) -> int:
    """A `kB` line of /proc/PID/status (VmRSS, VmHWM, ...); 0 if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_kib(pid: int) -> int:
    return status_kib(pid, "VmRSS")


def vm_hwm_kib(pid: int) -> int:
    return status_kib(pid, "VmHWM")


def pss_kib(pid: int) -> int:
    """Proportional set size from /proc/PID/smaps_rollup: shared pages divided among their users."""
    return pss_private_kib(pid)[0]


def pss_private_kib(pid: int) -> tuple[int, int]:
    """(PSS, private pages) from one read of /proc/PID/smaps_rollup; (0, 0) if it is gone."""
    pss = private = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
                elif line.startswith(("Private_Clean:", "Private_Dirty:")):
                    private += int(line.split()[1])
    except OSError:
        pass
    return pss, private


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(utime + stime, cutime + cstime) of `pid`, in seconds: its own CPU time and that of its
    reaped children."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, over all CPUs."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # without guest time, which is already in user
    return (total - idle) / tick, total / tick
