"""python -m bench.memory_limits: what memory limits cost and how fast they stop a task.

- stop: a process that enters an attempt's limit (a 64 MiB cgroup, or the watch) and then takes
  memory 8 MiB at a time, saying when it holds each step: the time from the step that crosses
  the limit to the moment the process is gone, polled as the supervisor polls (every 0.1 s);
- cost: what one attempt's cgroup adds to its step (made with its limit and OOM eventfd, the
  task process writing itself in, the counters read once, removed), median of many.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from orchestrator.worker.host.memory import CGROUP, WATCHED, MemoryLimits

TICK = 0.1  # the supervisor's loop
CHILD = r"""
import os, sys, time
procs = sys.argv[1]
if procs:
    open(procs, "w").write(str(os.getpid()))
blocks = []
for step in range(1, 65):
    blocks.append(bytearray(8 << 20))
    print(step * 8, time.monotonic(), flush=True)
    time.sleep(0.02)
time.sleep(30)
"""


def stop_seconds(limits: MemoryLimits, limit_mib: int = 64) -> float:
    attempt = limits.attempt(0, 0, limit_mib)
    assert attempt is not None
    child = subprocess.Popen([sys.executable, "-c", CHILD, attempt.procs_file or ""], stdout=subprocess.PIPE, text=True, start_new_session=True)
    attempt.started(child.pid)
    while child.poll() is None:
        attempt.check(time.monotonic())
        time.sleep(TICK)
    gone = time.monotonic()
    attempt.finish()
    steps = [line.split() for line in child.stdout or []]
    crossed = next(float(at) for size, at in steps if int(size) > limit_mib) if any(int(size) > limit_mib for size, _ in steps) else None
    if crossed is None:  # the kernel stopped it at the limit, before it could say it held more
        crossed = float(steps[-1][1])
    return gone - crossed


def cgroup_cost_ms(limits: MemoryLimits, rounds: int) -> tuple[float, float]:
    """(median ms of one attempt's cgroup set-up, enter, read and removal; median ms of the same
    process started without one)."""
    with_cgroup, without = [], []
    for i in range(rounds):
        started = time.perf_counter()
        child = subprocess.Popen(["/bin/sh", "-c", "echo $$ > /dev/null && exec /bin/true"])
        child.wait()
        without.append(time.perf_counter() - started)
        started = time.perf_counter()
        attempt = limits.attempt(1, i, 256)
        assert attempt is not None
        assert attempt.procs_file is not None
        child = subprocess.Popen(["/bin/sh", "-c", f'echo $$ > {attempt.procs_file} && exec /bin/true'])
        attempt.started(child.pid)
        child.wait()
        attempt.check(time.monotonic())
        attempt.finish()
        with_cgroup.append(time.perf_counter() - started)
    return statistics.median(with_cgroup) * 1000, statistics.median(without) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    for mode in (CGROUP, WATCHED):
        try:
            limits = MemoryLimits.start(mode)
        except Exception as exc:
            print(f"{mode}: not here ({exc})")
            continue
        times = [stop_seconds(limits) for _ in range(args.repeats)]
        print(f"{mode}: crossing 64 MiB -> stopped: median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms ({args.repeats} runs)")
        if mode == CGROUP:
            cost, bare = cgroup_cost_ms(limits, args.rounds)
            print(f"cgroup per attempt: {cost:.2f} ms median with it, {bare:.2f} ms without (+{cost - bare:.2f} ms), {args.rounds} rounds")
        limits.close()


if __name__ == "__main__":
    main()
