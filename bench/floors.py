"""The floors the engine's figures are compared with, measured in the same run on the same machine:

  * `python -c pass`: a fresh interpreter, what every task cost before the fork server;
  * a fork of a warm process: os.fork + _exit + waitpid in a process that has set Django up
    and imported the task runner (what the fork server preloads), the least a task process costs;
  * raw RQ: plain `rq worker` processes draining jobs that each run `python -c pass`, the ceiling
    of a queue of subprocess jobs without any of the engine's bookkeeping.

    python -m bench.floors warm-fork N   (used by `python -m bench`; prints JSON)
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import flowstats
from bench.stack import ROOT, Processes, rq_utc, wait_for_rq_workers

RAW_QUEUE = "bench-raw"
RAW_JOB = "bench.tasks.spawn_python_pass"
CHAINED_JOB = "bench.tasks.spawn_python_pass_then"
WORKER_CLASSES = {"simple": "rq.worker.SimpleWorker", "default": "rq.worker.Worker"}


def python_startup(runs: int, env: dict[str, str]) -> dict[str, Any]:
    """Mean wall time of `python -c pass` (the venv's interpreter), after one run not counted."""
    argv = [sys.executable, "-c", "pass"]
    subprocess.run(argv, env=env, check=True)
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        subprocess.run(argv, env=env, check=True)
        times.append(time.perf_counter() - began)
    return {"mean_ms": statistics.mean(times) * 1000, "median_ms": statistics.median(times) * 1000, "runs": runs}


def warm_fork(forks: int, env: dict[str, str]) -> dict[str, Any]:
    """Mean cost of fork + _exit + waitpid, in a fresh process that preloads what the fork server does."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.floors", "warm-fork", str(forks)],
        env=env, cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _warm_fork_main(forks: int) -> None:
    import django

    django.setup()
    import orchestrator.worker.task.runner  # noqa: F401  what the fork server preloads

    def one() -> float:
        began = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        return time.perf_counter() - began

    for _ in range(10):
        one()
    times = [one() for _ in range(forks)]
    rss = 0
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    print(json.dumps({"mean_ms": statistics.mean(times) * 1000, "median_ms": statistics.median(times) * 1000,
                      "forks": forks, "parent_rss_mib": round(rss / 1024, 1)}))


def raw_rq(jobs: int, workers: int, worker_class: str, processes: Processes, redis_url: str, timeout: float) -> dict[str, Any]:
    """Start `workers` plain `rq worker` processes, wait until they are idle, enqueue `jobs` jobs
    (each runs `python -c pass`) at once and time until the last one ended (its RQ ended_at)."""
    from rq import Queue
    from rq.job import Job
    from rq.registry import FailedJobRegistry, FinishedJobRegistry

    from orchestrator.foundation.redis_conn import get_redis

    rq_cli = str(Path(sys.executable).parent / "rq")
    names = [f"bench-raw-{n}-{os.getpid()}" for n in range(1, workers + 1)]
    children = [
        processes.start_command(f"raw-rq-{n}", [rq_cli, "worker", "--url", redis_url, "--worker-class", WORKER_CLASSES[worker_class],
                                               "--name", name, RAW_QUEUE])
        for n, name in enumerate(names, 1)
    ]
    try:
        wait_for_rq_workers(names, processes)
        connection = get_redis()
        queue = Queue(RAW_QUEUE, connection=connection)
        finished, failed = FinishedJobRegistry(queue=queue), FailedJobRegistry(queue=queue)
        began = time.time()
        enqueued = queue.enqueue_many([Queue.prepare_data(RAW_JOB, result_ttl=600) for _ in range(jobs)])
        deadline = time.monotonic() + timeout
        while finished.count + failed.count < jobs:
            processes.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"raw RQ: {finished.count + failed.count} of {jobs} jobs done after {timeout:.0f}s")
            time.sleep(0.05)
        done = Job.fetch_many([job.id for job in enqueued], connection=connection)
        ends = [rq_utc(job.ended_at).timestamp() for job in done if job is not None and job.ended_at]
        busy = [(rq_utc(job.ended_at) - rq_utc(job.started_at)).total_seconds() for job in done if job and job.ended_at and job.started_at]
        wall = max(ends) - began
        return {
            "jobs": jobs, "workers": workers, "worker_class": WORKER_CLASSES[worker_class], "failed": failed.count,
            "wall_s": round(wall, 3), "jobs_per_s": jobs / wall, "job_busy_median_ms": statistics.median(busy) * 1000,
        }
    finally:
        processes.stop(children)


def raw_rq_chained(flows: int, burst: int, workers: int, worker_class: str, processes: Processes, redis_url: str,
                   timeout: float) -> dict[str, Any]:
    """Plain RQ's three-step flow: three jobs of `python -c pass`, each enqueuing the next when its
    subprocess ended (`bench.tasks.spawn_python_pass_then`), on `workers` plain `rq worker`
    processes. `flows` flows one at a time (enqueue -> the third job's ended_at), then `burst`
    flows enqueued at once (the first enqueue -> the last third job's ended_at)."""
    import uuid

    from rq import Queue
    from rq.job import Job, JobStatus

    from orchestrator.foundation.redis_conn import get_redis

    rq_cli = str(Path(sys.executable).parent / "rq")
    names = [f"bench-rawchain-{n}-{os.getpid()}" for n in range(1, workers + 1)]
    children = [
        processes.start_command(f"raw-rq-chain-{n}", [rq_cli, "worker", "--url", redis_url, "--worker-class", WORKER_CLASSES[worker_class],
                                                     "--name", name, RAW_QUEUE])
        for n, name in enumerate(names, 1)
    ]
    connection = get_redis()
    queue = Queue(RAW_QUEUE, connection=connection)

    def flow() -> str:
        """Enqueue a flow's first job; the id its third job will have."""
        key = uuid.uuid4().hex
        queue.enqueue(CHAINED_JOB, [f"{key}-2", f"{key}-3"], job_id=f"{key}-1", result_ttl=600)
        return f"{key}-3"

    def wait(last: list[str]) -> list[float]:
        deadline = time.monotonic() + timeout
        pending = list(last)
        while pending:
            jobs = Job.fetch_many(pending, connection=connection)
            statuses = [job.get_status(refresh=False) if job is not None else None for job in jobs]
            if JobStatus.FAILED in statuses:
                raise RuntimeError("raw RQ chained: a job failed")
            pending = [job_id for job_id, status in zip(pending, statuses) if status != JobStatus.FINISHED]
            processes.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"raw RQ chained: {len(pending)} flows unfinished after {timeout:.0f}s")
            if pending:
                time.sleep(0.002 if len(last) == 1 else 0.05)
        return [rq_utc(job.ended_at).timestamp() for job in Job.fetch_many(last, connection=connection)]

    try:
        wait_for_rq_workers(names, processes)
        wait([flow()])  # warm
        each = []
        for _ in range(flows):
            began = time.time()
            each.append(wait([flow()])[0] - began)
        began = time.time()
        lasts = [flow() for _ in range(burst)]
        wall = max(wait(lasts)) - began
        return {**flowstats.end_to_end(each), "burst": burst, "burst_wall_s": round(wall, 3), "flows_per_s": burst / wall, "workers": workers,
                "worker_class": WORKER_CLASSES[worker_class]}
    finally:
        processes.stop(children)


if __name__ == "__main__":
    if sys.argv[1:2] == ["warm-fork"]:
        _warm_fork_main(int(sys.argv[2]))
    else:
        sys.exit(__doc__)


def select_one() -> float:
    """The median seconds of `SELECT 1` on Django's connection: a round trip to the database,
    the floor of any statement a step makes."""
    from django.db import connection

    times = []
    with connection.cursor() as cursor:
        for _ in range(200):
            began = time.perf_counter()
            cursor.execute("SELECT 1")
            times.append(time.perf_counter() - began)
    return statistics.median(times)
