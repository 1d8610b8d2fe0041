"""Memory of the processes a benchmark starts: PSS of workers and their task processes at the peak
of a run, RSS of an idle stack."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from bench import procfs

FORK_SERVER = "orchestrator.worker.forkserver"


def worker_members(worker_pid: int) -> dict[str, list[int]]:
    """A worker's processes: itself, its fork server, the fork server's task processes (and
    whatever they started), and anything else below the worker (orphans it reaps)."""
    below = procfs.children(worker_pid)
    servers = [pid for pid in below if FORK_SERVER in procfs.cmdline(pid)]
    tasks = [pid for server in servers for pid in procfs.subtree(server) if procfs.alive(pid)]
    others = [pid for pid in below if pid not in servers for pid in [pid, *procfs.subtree(pid)]]
    return {"worker": [worker_pid], "fork_server": servers, "tasks": tasks, "other": others}


class ForkServers:
    """Each worker's fork server, found once (listing a worker's children reads a file per
    thread, and a worker at high concurrency has hundreds) and looked for again only if it is gone."""

    def __init__(self, worker_pids: list[int]) -> None:
        self.worker_pids = worker_pids
        self.known: dict[int, int] = {}

    def servers(self) -> list[int]:
        found = []
        for worker in self.worker_pids:
            server = self.known.get(worker)
            if server is None or FORK_SERVER not in procfs.cmdline(server):
                server = next((pid for pid in procfs.children(worker) if FORK_SERVER in procfs.cmdline(pid)), None)
                if server is None:
                    continue
                self.known[worker] = server
            found.append(server)
        return found

    def task_count(self) -> int:
        """Task processes alive under the fork servers: their direct children, less the zombies
        a fork server keeps until its worker is done with them."""
        return sum(1 for server in self.servers() for pid in procfs.children(server) if procfs.alive(pid))


@dataclass
class PssSample:
    at: float
    total_kib: int
    by_kind: dict[str, int]
    private_by_kind: dict[str, int]  # pages no other process shares (copied on write, or new)
    task_processes: int
    seconds_to_read: float


def pss_sample(worker_pids: list[int]) -> PssSample:
    began = time.monotonic()
    by_kind = {"worker": 0, "fork_server": 0, "tasks": 0, "other": 0}
    private = dict.fromkeys(by_kind, 0)
    tasks = 0
    for worker in worker_pids:
        for kind, pids in worker_members(worker).items():
            for pid in pids:
                pss, own = procfs.pss_private_kib(pid)
                by_kind[kind] += pss
                private[kind] += own
            if kind == "tasks":
                tasks += len(pids)
    return PssSample(began, sum(by_kind.values()), by_kind, private, tasks, time.monotonic() - began)


class PeakPss:
    """The summed PSS of the workers' processes at the peak of a run, read without disturbing it
    much: the number of live task processes is followed cheaply (the fork servers' children)
    every `poll` seconds, and the expensive read (smaps_rollup of every process: seconds for a
    thousand processes on two busy cores) happens only when that number has grown by 10 % since
    the last read and `spacing` seconds have passed, when it comes within 5 % of `expected`, or
    when it starts to fall with no read taken near its top; at most `max_samples` times. Keeps
    the sample with the largest total. Runs on a thread of its own."""

    def __init__(self, worker_pids: list[int], expected: int, poll: float = 0.5, spacing: float = 5.0, max_samples: int = 8) -> None:
        self.worker_pids = worker_pids
        self.expected = expected
        self.poll = poll
        self.spacing = spacing
        self.max_samples = max_samples
        self.peak: PssSample | None = None
        self.samples: list[PssSample] = []
        self.most_tasks = 0
        self.fork_servers = ForkServers(worker_pids)
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self.run, name="pss-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def run(self) -> None:
        sampled_count, sampled_at = 0, 0.0
        while not self._halt.wait(self.poll) and len(self.samples) < self.max_samples:
            count = self.fork_servers.task_count()
            now = time.monotonic()
            self.most_tasks = max(self.most_tasks, count)
            grown = count >= 1.1 * sampled_count and now - sampled_at >= self.spacing
            near_expected = count >= 0.95 * self.expected and sampled_count < 0.95 * self.expected
            falling = count < self.most_tasks and sampled_count < 0.9 * self.most_tasks  # past a top never sampled
            if count and (grown or near_expected or falling):
                sample = pss_sample(self.worker_pids)
                self.samples.append(sample)
                sampled_count, sampled_at = max(count, sample.task_processes), time.monotonic()
                if self.peak is None or sample.total_kib > self.peak.total_kib:
                    self.peak = sample

    def stop(self) -> None:
        self._halt.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        peak = self.peak
        return {
            "peak_pss_mib": round(peak.total_kib / 1024, 1) if peak else None,
            "peak_by_kind_mib": {k: round(v / 1024, 1) for k, v in peak.by_kind.items()} if peak else {},
            "peak_private_by_kind_mib": {k: round(v / 1024, 1) for k, v in peak.private_by_kind.items()} if peak else {},
            "task_processes_at_peak": peak.task_processes if peak else 0,
            "most_task_processes_seen": self.most_tasks,
            "samples": len(self.samples),
            "sampled": [{"task_processes": x.task_processes, "pss_mib": round(x.total_kib / 1024, 1), "read_s": round(x.seconds_to_read, 2)}
                        for x in self.samples],
            "seconds_per_sample": round(max((s.seconds_to_read for s in self.samples), default=0.0), 2),
        }
