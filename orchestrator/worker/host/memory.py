"""Memory limits of a worker's attempts: a cgroup per attempt where the worker can make one,
else a watch over the memory of the task's process tree.

Plain file I/O on the cgroup filesystem (no library: the maintained ones handle either v1 or
v2, none reads the OOM counters this needs). Both versions:

- v1, the memory controller mounted at /sys/fs/cgroup/memory (root, or a delegated directory):
  `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes`, so swap is no way round it), the
  kill read from `memory.oom_control`'s `oom_kill`, the limit reached from `memory.failcnt`,
  the peak from `memory.max_usage_in_bytes`;
- v2 (unified), where the worker's own cgroup already hands the memory controller to its
  children (a delegated subtree whose processes live in leaves): `memory.max`,
  `memory.swap.max` 0, `memory.oom.group` 1 (the kernel kills the whole attempt), the kill and
  the limit reached from `memory.events` (`oom_kill`, `oom`), the peak from `memory.peak`.

Layout: under the worker's own memory cgroup, one directory per worker named after its pid and
that process's start time (`orchestrator-PID-START`), and in it one per attempt
(`ti-ID-TOKEN`). An attempt's cgroup is removed when its attempt ends; a worker removes its own
directory when it stops, and on start every directory of a worker whose process is gone
(killed -9, its machine rebooted into the same cgroup): the next worker cleans up after one
that died.

Where no cgroup can be used (not root, no delegation), each attempt with a limit is watched:
the proportional set size of every process of its tree (`/proc/PID/smaps_rollup`, or the
resident size where that cannot be read) summed at least every `WATCH_INTERVAL` seconds, and the
tree killed past the limit. The worker runs as root when tasks run as a task user, so it can
read those files even of the fork server's non-dumpable children.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.worker.host.oom import oom_kill_in, read_bytes

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
MIB = 1 << 20
# How often a watched attempt's processes are measured (the contract: at least every 0.5 s).
WATCH_INTERVAL = 0.25
# How often an attempt's cgroup counters are read for a kill by the kernel.
CGROUP_POLL_INTERVAL = 0.1
# How long removing an ended attempt's cgroup is tried before it is left to the next sweep.
REMOVE_PATIENCE = 2.0
WORKER_DIR = re.compile(r"^orchestrator-(\d+)-(\d+)$")

CGROUP, WATCHED, AUTO = "cgroup", "watched", "auto"
MODES = (AUTO, CGROUP, WATCHED)


class MemoryLimitsUnavailable(Exception):
    """ORCHESTRATOR_MEMORY_LIMITS=cgroup on a worker that cannot make cgroups: why."""


# --- reading /proc ----------------------------------------------------------------------------------


def _read(path: Path | str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def _keyed(text: str | None) -> dict[str, int]:
    """`key value` lines (memory.events, memory.oom_control, memory.stat) as a dict."""
    values: dict[str, int] = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        try:
            values[key] = int(value.strip())
        except ValueError:
            continue
    return values


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat): with its
    pid, a name no later process has."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def machine_oom_kills() -> int | None:
    """The machine's OOM kills since boot (/proc/vmstat `oom_kill`), or None. Read twice for
    every attempt: the one line is looked for, not the whole file parsed."""
    return oom_kill_in(read_bytes("/proc/vmstat"))


# --- the cgroup filesystem ------------------------------------------------------------------------


@dataclass(frozen=True)
class Hierarchy:
    """Where this process's memory cgroup is, and which version manages it."""

    version: int  # 1 or 2
    own: Path  # this process's memory cgroup directory

    @classmethod
    def find(cls, root: Path | None = None, pid: int | str = "self") -> Hierarchy | None:
        root = root or CGROUP_ROOT
        text = _read(f"/proc/{pid}/cgroup")
        if text is None:
            return None
        unified = None
        for line in text.splitlines():
            hierarchy, _, rest = line.partition(":")
            controllers, _, group = rest.partition(":")
            group = group.lstrip("/")
            if "memory" in controllers.split(",") and (root / "memory").is_dir():
                return cls(1, root / "memory" / group)
            if hierarchy == "0" and controllers == "":
                unified = group
        if unified is not None and (root / "cgroup.controllers").is_file():
            own = root / unified
            if "memory" in (_read(own / "cgroup.controllers") or "").split():
                return cls(2, own)
        return None

    def procs_file(self, directory: Path) -> Path:
        return directory / "cgroup.procs"

    def make(self, directory: Path, *, limit_mib: int | None = None, parent: bool = False) -> None:
        """Make `directory` (a worker's, `parent`, or an attempt's with its limit)."""
        directory.mkdir(mode=0o755)
        try:
            if self.version == 2 and parent:
                (directory / "cgroup.subtree_control").write_text("+memory")
            if limit_mib is not None:
                self._limit(directory, limit_mib * MIB)
        except OSError:
            self.remove(directory)
            raise

    def _limit(self, directory: Path, limit: int) -> None:
        if self.version == 1:
            (directory / "memory.limit_in_bytes").write_text(str(limit))
            memsw = directory / "memory.memsw.limit_in_bytes"
            if memsw.exists():  # swap accounting on: memory plus swap may not exceed it either
                memsw.write_text(str(limit))
            return
        (directory / "memory.max").write_text(str(limit))
        for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
            if (directory / name).exists():
                (directory / name).write_text(value)

    def oom_events(self, directory: Path) -> int | None:
        """v1: an eventfd the kernel signals each time this cgroup itself runs out of memory at
        its limit (never for an OOM of the machine or of a cgroup above): `memory.failcnt` is
        not kept by every kernel with swap accounting on. None on v2 (its memory.events says)."""
        if self.version != 1:
            return None
        events = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        control = os.open(directory / "memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
        try:
            (directory / "cgroup.event_control").write_text(f"{events} {control}")
        except OSError:
            os.close(events)
            return None
        finally:
            os.close(control)
        return events

    def counters(self, directory: Path) -> tuple[int, int, bool]:
        """(OOM kills of its processes, times its own limit was reached, under OOM now)."""
        if self.version == 1:
            control = _keyed(_read(directory / "memory.oom_control"))
            # With swap accounting the memory+swap limit (set to the same) is often hit first.
            hits = sum(int(_read(directory / name) or 0) for name in ("memory.failcnt", "memory.memsw.failcnt"))
            return control.get("oom_kill", 0), hits, bool(control.get("under_oom", 0))
        events = _keyed(_read(directory / "memory.events"))
        return events.get("oom_kill", 0), events.get("oom", 0), False

    def peak_bytes(self, directory: Path) -> int | None:
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        text = _read(directory / name)
        try:
            return int(text) if text is not None else None
        except ValueError:
            return None

    def pids(self, directory: Path) -> list[int]:
        return [int(pid) for pid in (_read(directory / "cgroup.procs") or "").split()]

    def kill_all(self, directory: Path) -> None:
        """SIGKILL every process in it, again until none is left (a fork may race the first
        pass); v2's cgroup.kill does it in one write."""
        kill_file = directory / "cgroup.kill"
        if self.version == 2 and kill_file.exists():
            try:
                kill_file.write_text("1")
                return
            except OSError:
                pass
        for _ in range(20):
            pids = self.pids(directory)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.005)

    def remove(self, directory: Path) -> bool:
        """Remove it with what it holds (an attempt's directories, for a worker's); False when
        a process there has not gone yet."""
        for child in [entry for entry in _subdirectories(directory)]:
            self.kill_all(child)
            self.remove(child)
        try:
            directory.rmdir()
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
                return False
            raise
        return True


def _subdirectories(directory: Path) -> list[Path]:
    try:
        return [Path(entry.path) for entry in os.scandir(directory) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []


# --- one attempt ------------------------------------------------------------------------------------


@dataclass
class MemoryReport:
    """What the limit of one attempt saw, for classify()."""

    limit_mib: int
    enforced_by: str  # "cgroup" | "watched"
    peak_mib: int | None = None
    exceeded: bool = False  # past its limit: application/memory_limit_exceeded
    # The kernel's OOM killer stopped one of its processes while under its own limit (read from
    # its cgroup's own counters): the machine (or a cgroup above) ran out.
    killed_by_host_oom: bool = False


class AttemptMemory:
    """The limit of one attempt, as the supervisor drives it: `procs_file` (where the task
    process writes its pid before any of the task's code runs), `started(pid)`, `check(now)`
    on every round of its loop, `finish()` once its processes are gone."""

    procs_file: str | None = None

    def __init__(self, limit_mib: int, enforced_by: str) -> None:
        self.report = MemoryReport(limit_mib=limit_mib, enforced_by=enforced_by)
        self.pgid = 0
        self.exceeded_at: float | None = None  # monotonic: when it was found past its limit

    def started(self, pid: int) -> None:
        self.pgid = pid

    def check(self, now: float) -> bool:
        """True the first time the attempt is found past its limit (its processes are being
        killed); False otherwise."""
        raise NotImplementedError

    def kill(self) -> None:
        """SIGKILL every process of the attempt."""
        raise NotImplementedError

    def measure(self) -> MemoryReport:
        """What it saw so far (the peak, whether the kernel killed a process of it)."""
        return self.report

    def finish(self) -> MemoryReport:
        """Its processes are gone: its last measure, and nothing of it left behind."""
        return self.measure()


class CgroupAttempt(AttemptMemory):
    def __init__(self, hierarchy: Hierarchy, directory: Path, limit_mib: int, leftovers: list[Path]) -> None:
        super().__init__(limit_mib, CGROUP)
        self.hierarchy = hierarchy
        self.directory = directory
        self.procs_file = str(hierarchy.procs_file(directory))
        self.leftovers = leftovers  # the worker's: directories to remove on its next sweep
        self.next_check = 0.0
        self.removed = False
        self.own_ooms = 0  # v1: its own OOMs, counted by the eventfd
        self.events = hierarchy.oom_events(directory)

    def _counters(self) -> tuple[int, int, bool]:
        oom_kills, limit_hits, under_oom = self.hierarchy.counters(self.directory)
        if self.events is not None:
            try:
                self.own_ooms += os.eventfd_read(self.events)
            except BlockingIOError:
                pass
            except OSError:
                pass
        return oom_kills, limit_hits + self.own_ooms, under_oom

    def check(self, now: float) -> bool:
        if self.report.exceeded or now < self.next_check:
            return False
        self.next_check = now + CGROUP_POLL_INTERVAL
        oom_kills, limit_hits, under_oom = self._counters()
        # The kernel killed a process of it having reached its own limit (v1: a victim in this
        # cgroup and its usage at the limit; v2: an OOM of this cgroup itself), or the attempt
        # is stuck at its limit with nothing the kernel may kill.
        if (oom_kills and limit_hits) or under_oom:
            self._exceeded(now)
            return True
        return False

    def _exceeded(self, now: float) -> None:
        self.report.exceeded = True
        self.exceeded_at = now
        self.kill()

    def kill(self) -> None:
        self.hierarchy.kill_all(self.directory)

    def measure(self) -> MemoryReport:
        if self.removed:
            return self.report
        oom_kills, limit_hits, _ = self._counters()
        if oom_kills and limit_hits:
            self.report.exceeded = True
        elif oom_kills:
            self.report.killed_by_host_oom = True
        peak = self.hierarchy.peak_bytes(self.directory)
        if peak is not None:
            self.report.peak_mib = _mib(peak)
        return self.report

    def finish(self) -> MemoryReport:
        """Read its last counters, then remove it (killing whatever of it is left: a process that
        left the task's group is still in its cgroup)."""
        if self.removed:
            return self.report
        self.measure()
        self.removed = True
        if self.events is not None:
            os.close(self.events)
            self.events = None
        deadline = time.monotonic() + REMOVE_PATIENCE
        while True:
            self.kill()
            try:
                if self.hierarchy.remove(self.directory):
                    break
            except OSError as exc:
                log.warning("could not remove the cgroup %s: %s", self.directory, exc)
                break
            if time.monotonic() >= deadline:
                log.warning("the cgroup %s still holds a process; it is removed later", self.directory)
                self.leftovers.append(self.directory)
                break
            time.sleep(0.02)
        return self.report


class WatchedAttempt(AttemptMemory):
    """An attempt whose processes are measured from /proc and killed past the limit."""

    def __init__(self, limit_mib: int) -> None:
        super().__init__(limit_mib, WATCHED)
        self.next_check = 0.0
        self.peak_bytes = 0

    def started(self, pid: int) -> None:
        # Measured once at once: a task killed from outside before the loop's first round still
        # has a peak to report.
        super().started(pid)
        self.peak_bytes = process_memory(pid)  # just handed over: it has no children yet

    def check(self, now: float) -> bool:
        if self.report.exceeded or self.pgid == 0 or now < self.next_check:
            return False
        self.next_check = now + WATCH_INTERVAL
        used = sum(process_memory(pid) for pid in tree(self.pgid))
        self.peak_bytes = max(self.peak_bytes, used)
        if used > self.report.limit_mib * MIB:
            self.report.exceeded = True
            self.exceeded_at = now
            self.kill()
            return True
        return False

    def kill(self) -> None:
        for pid in tree(self.pgid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except OSError:
            pass

    def measure(self) -> MemoryReport:
        if self.peak_bytes:
            self.report.peak_mib = _mib(self.peak_bytes)
        return self.report


def _mib(size: int) -> int:
    return (size + MIB - 1) // MIB


def process_memory(pid: int) -> int:
    """Bytes of memory `pid` holds: its proportional set size (shared pages divided among the
    processes that share them: a forked task's share of the fork server's pages is small), or
    its resident size where smaps_rollup cannot be read; 0 once it is gone."""
    rollup = _read(f"/proc/{pid}/smaps_rollup")
    if rollup:
        for line in rollup.splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    statm = _read(f"/proc/{pid}/statm")
    if statm:
        try:
            return int(statm.split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (IndexError, ValueError):
            return 0
    return 0


def tree(pgid: int) -> list[int]:
    """Every live process of a task: its session and group (the task process leads both), and
    every descendant of those, also one that left them with setsid()."""
    parents: dict[int, int] = {}
    members: set[int] = set()
    try:
        entries = [entry.name for entry in os.scandir("/proc") if entry.name.isdigit()]
    except OSError:
        return [pgid]
    for name in entries:
        text = _read(f"/proc/{name}/stat")
        if text is None:
            continue
        fields = text[text.rfind(")") + 2 :].split()
        if len(fields) < 4 or fields[0] in ("Z", "X"):
            continue
        pid = int(name)
        parents[pid] = int(fields[1])
        if int(fields[2]) == pgid or int(fields[3]) == pgid:
            members.add(pid)
    grew = True
    while grew:
        found = {pid for pid, parent in parents.items() if parent in members and pid not in members}
        members |= found
        grew = bool(found)
    return sorted(members)


# --- one worker -------------------------------------------------------------------------------------


class MemoryLimits:
    """A worker's memory limits: `mode` ("cgroup" or "watched"), `attempt()` for each attempt
    with a limit, `sweep()` now and then, `close()` when the worker stops."""

    def __init__(self, mode: str, hierarchy: Hierarchy | None = None, directory: Path | None = None) -> None:
        self.mode = mode
        self.hierarchy = hierarchy
        self.directory = directory  # this worker's own: orchestrator-PID-START
        self.leftovers: list[Path] = []
        self._lock = threading.Lock()

    @classmethod
    def start(cls, setting: str = AUTO, *, root: Path | None = None) -> MemoryLimits:
        """The worker's limits by ORCHESTRATOR_MEMORY_LIMITS: cgroups where they can be made
        (`auto`, `cgroup`), else watched; raises MemoryLimitsUnavailable for `cgroup` when they
        cannot. Directories of workers that are gone are removed first."""
        setting = (setting or AUTO).strip().lower()
        if setting not in MODES:
            raise MemoryLimitsUnavailable(f"ORCHESTRATOR_MEMORY_LIMITS must be one of {', '.join(MODES)}, not {setting!r}")
        if setting == WATCHED:
            return cls(WATCHED)
        hierarchy = Hierarchy.find(root or CGROUP_ROOT)
        why = "no memory cgroup controller is mounted for this process" if hierarchy is None else ""
        directory = None
        if hierarchy is not None:
            remove_dead_workers(hierarchy)
            directory = hierarchy.own / f"orchestrator-{os.getpid()}-{start_time(os.getpid()) or 0}"
            try:
                if directory.exists():
                    hierarchy.remove(directory)
                hierarchy.make(directory, parent=True)
                probe = directory / "probe"
                hierarchy.make(probe, limit_mib=64)  # can it limit an attempt here?
                hierarchy.remove(probe)
            except OSError as exc:
                why = f"cannot make a cgroup in {hierarchy.own}: {exc.strerror or exc}"
                try:
                    hierarchy.remove(directory)
                except OSError:
                    pass
                hierarchy = directory = None
        if hierarchy is None:
            if setting == CGROUP:
                raise MemoryLimitsUnavailable(f"ORCHESTRATOR_MEMORY_LIMITS=cgroup, but {why}")
            return cls(WATCHED)
        return cls(CGROUP, hierarchy, directory)

    def attempt(self, task_instance_id: int, token: int, limit_mib: int | None) -> AttemptMemory | None:
        """The limit of one attempt (None without one). A cgroup that cannot be made for it
        falls back to watching it."""
        if limit_mib is None:
            return None
        if self.mode == CGROUP and self.hierarchy is not None and self.directory is not None:
            directory = self.directory / f"ti-{task_instance_id}-{token}"
            try:
                if directory.exists():
                    self.hierarchy.remove(directory)
                self.hierarchy.make(directory, limit_mib=limit_mib)
                return CgroupAttempt(self.hierarchy, directory, limit_mib, self.leftovers)
            except OSError as exc:
                log.error("could not make a cgroup for task instance %s attempt %s (%s); watching its memory instead", task_instance_id, token, exc)
        return WatchedAttempt(limit_mib)

    def sweep(self) -> None:
        """Remove what an ended attempt left behind, and the directories of dead workers."""
        if self.hierarchy is None:
            return
        with self._lock:
            left, self.leftovers[:] = list(self.leftovers), []
        for directory in left:
            self.hierarchy.kill_all(directory)
            try:
                if not self.hierarchy.remove(directory):
                    self.leftovers.append(directory)
            except OSError:
                pass
        remove_dead_workers(self.hierarchy)

    def close(self) -> None:
        """The worker stops: its own directory goes (its attempts are over)."""
        if self.hierarchy is not None and self.directory is not None:
            try:
                self.hierarchy.remove(self.directory)
            except OSError as exc:
                log.warning("could not remove the cgroup %s: %s", self.directory, exc)


def remove_dead_workers(hierarchy: Hierarchy) -> list[Path]:
    """Remove the directory of every worker (beside this process's own cgroup) whose process is
    gone, with its attempts' cgroups and whatever still runs in them; the ones removed."""
    removed = []
    for directory in _subdirectories(hierarchy.own):
        match = WORKER_DIR.match(directory.name)
        if match is None:
            continue
        pid, started = int(match[1]), int(match[2])
        if start_time(pid) == started:
            continue  # that worker lives
        try:
            if hierarchy.remove(directory):
                removed.append(directory)
                log.info("removed the cgroup %s of a worker that is gone", directory)
        except OSError as exc:
            log.warning("could not remove the cgroup %s of a worker that is gone: %s", directory, exc)
    return removed


def enter(procs_file: str) -> None:
    """Put the calling process into a cgroup (its `cgroup.procs`): what a task process does
    first, while it may still write there (before it drops to the task user)."""
    with open(procs_file, "w") as handle:
        handle.write(str(os.getpid()))


def own_procs_file() -> str | None:
    """This process's memory cgroup's `cgroup.procs`, to step back into (the fork server)."""
    hierarchy = Hierarchy.find()
    return str(hierarchy.procs_file(hierarchy.own)) if hierarchy is not None else None
