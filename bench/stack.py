"""What the engine benchmarks share: the processes they start, DAGs and runs, waiting, latencies.

Everything Django is imported inside the functions: the caller sets up Django first (against
its throwaway database) with `setup_django()`.
"""
from __future__ import annotations

import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import procfs

ROOT = Path(__file__).resolve().parent.parent
MANAGE = ROOT / "manage.py"
NOOP = "bench.tasks.noop"
LOG_ALARMS = ("database is locked", "OperationalError")
LOG_NOTABLE = ("Traceback", " ERROR ", " CRITICAL ")


def handle_stop_signals() -> None:
    """Ctrl-C or SIGTERM unwinds the caller's ExitStack, also when started where SIGINT is
    ignored (a background job), so every process, database and Redis database is cleaned up."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))


def child_env(database_url: str, redis_url: str, interval: float | None = None, **extra: str) -> dict[str, str]:
    """The environment of the processes a benchmark starts: the project's defaults, except
    DEBUG off and short stop graces (idle workers stop at once; these only bound a stop that
    catches a task mid-run)."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        DJANGO_SETTINGS_MODULE="orchestrator.settings",
        SECRET_KEY=os.environ.get("SECRET_KEY") or "bench-only",
        DEBUG="0",  # DEBUG keeps every query in memory: it would inflate RSS and time
        LOG_LEVEL="INFO",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        ORCHESTRATOR_WORKER_SHUTDOWN_GRACE="5",
        ORCHESTRATOR_KILL_GRACE="1",
    )
    if interval is not None:
        env["ORCHESTRATOR_SCHEDULER_INTERVAL"] = str(interval)
    env.update(extra)
    return env


def setup_django(env: dict[str, str]) -> None:
    """Point this process at the benchmark's database and Redis, then set Django up."""
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "SECRET_KEY", "DEBUG")})
    os.environ["LOG_LEVEL"] = "WARNING"  # this process's own scheduler passes must not log per run
    import django

    django.setup()


@contextmanager
def embedded_redis(data_dir: Path) -> Iterator[str]:
    from orchestrator.local.embedded_redis import EmbeddedRedis

    server = EmbeddedRedis(data_dir)
    url = server.start()
    try:
        yield url
    finally:
        server.stop()
        print("stopped the embedded Redis server")


# --- the processes ---------------------------------------------------------------------------------


@dataclass
class Child:
    name: str
    args: list[str]
    log_path: Path
    process: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


class Processes:
    """Long-running processes, each logging to a file; all stopped on exit, whatever happens."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.children: list[Child] = []
        self.stopped: list[Child] = []  # their logs are still scanned

    def start(self, name: str, *args: str) -> Child:
        """`manage.py ARGS...`"""
        return self.start_command(name, [sys.executable, str(MANAGE), *args])

    def start_command(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Child:
        from orchestrator.local.embedded_redis import die_with_parent

        child = Child(name, list(argv), self.log_dir / f"{name}.log")
        with open(child.log_path, "ab") as log:
            child.process = subprocess.Popen(
                list(argv),
                env=env or self.env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches only the benchmark, which stops each child
                # And if the benchmark is killed outright, they go too. Children are started while
                # no other thread of this process runs.
                preexec_fn=die_with_parent,
            )
        self.children.append(child)
        return child

    def live(self, prefix: str = "") -> list[Child]:
        return [c for c in self.children if c.name.startswith(prefix) and c.process is not None and c.process.poll() is None]

    def dead(self) -> Child | None:
        return next((c for c in self.children if c.process is not None and c.process.poll() is not None), None)

    def check_alive(self) -> None:
        dead = self.dead()
        if dead is not None:
            tail = dead.log_path.read_text(errors="replace").splitlines()[-20:]
            raise RuntimeError(f"{dead.name} exited with code {dead.process.returncode}:\n" + "\n".join(tail))

    def usage(self) -> dict[str, tuple[int, float, float]]:
        """Per live process: peak RSS in KiB, its own CPU seconds, and its reaped children's
        (for a worker: the task processes it started)."""
        return {c.name: (procfs.vm_hwm_kib(c.pid), *procfs.cpu_seconds(c.pid)) for c in self.live()}

    def stop(self, children: list[Child] | None = None, timeout: float = 20.0) -> None:
        """SIGTERM to each (workers finish their job, the scheduler its pass), SIGKILL to the group
        after `timeout`. Stopped children are forgotten, their logs kept."""
        targets = [c for c in (self.children if children is None else children) if c in self.children]
        running = [c for c in targets if c.process is not None and c.process.poll() is None]
        for child in running:
            try:
                child.process.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        for child in running:
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"{child.name} did not stop within {timeout:.0f}s of SIGTERM: killing it")
                try:
                    os.killpg(child.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                child.process.wait()
        for child in targets:
            self.children.remove(child)
            self.stopped.append(child)

    def scan_logs(self) -> tuple[dict[str, list[str]], list[str]]:
        """Lines naming a database error (the alarms) and other errors, over every log."""
        alarms: dict[str, list[str]] = {pattern: [] for pattern in LOG_ALARMS}
        notable: list[str] = []
        for child in self.stopped + self.children:
            text = child.log_path.read_text(errors="replace") if child.log_path.exists() else ""
            for line in text.splitlines():
                for pattern in LOG_ALARMS:
                    if pattern in line:
                        alarms[pattern].append(f"{child.name}: {line.strip()}")
                if any(p in line for p in LOG_NOTABLE):
                    notable.append(f"{child.name}: {line.strip()}")
        return alarms, notable


def wait_for_rq_workers(names: list[str], processes: Processes, timeout: float = 120.0) -> None:
    """Until every named worker has registered with RQ (an OrchestratorWorker registers once its
    fork server is warm)."""
    from rq.worker import Worker

    from orchestrator.foundation.redis_conn import get_redis

    deadline = time.monotonic() + timeout
    while True:
        registered = {w.name for w in Worker.all(connection=get_redis())}
        if set(names) <= registered:
            return
        processes.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers {sorted(set(names) - registered)} did not register within {timeout:.0f}s")
        time.sleep(0.1)


# --- DAGs and runs ----------------------------------------------------------------------------------


# default_args of every DAG the benchmarks make (`--memory-limit` sets one for every task).
DAG_DEFAULT_ARGS: dict[str, Any] = {}


def make_dag(
    dag_id: str,
    tasks: dict[str, list[str]],
    *,
    bash: str | None = None,
    python_callable: str = NOOP,
    op_kwargs: dict[str, Any] | None = None,
    max_active_runs: int = 1,
):
    """A DAG whose tasks all run `bash` (a command) or else `python_callable(**op_kwargs)`."""
    from orchestrator.models import Dag, Task

    dag = Dag.objects.create(dag_id=dag_id, schedule=None, max_active_runs=max(1, max_active_runs), default_args=dict(DAG_DEFAULT_ARGS))
    Task.objects.bulk_create(
        Task(
            dag=dag,
            task_id=task_id,
            bash_command=bash or "",
            python_callable="" if bash else python_callable,
            op_kwargs={} if bash else dict(op_kwargs or {}),
            upstream=upstream,
            position=position,
        )
        for position, (task_id, upstream) in enumerate(tasks.items())
    )
    return dag


def trigger(dag, count: int) -> tuple[list[int], datetime]:
    """Create `count` queued runs in one transaction (the scheduler starts them); return their ids
    and the commit time, the moment they became visible."""
    from django.db import transaction
    from django.utils import timezone

    from orchestrator.engine.run_creation import create_run
    from orchestrator.models import DagRun

    now = timezone.now()
    with transaction.atomic():
        ids = [
            create_run(dag, run_type=DagRun.RunType.MANUAL, logical_date=now + timedelta(microseconds=i), now=now, triggered_by="bench").pk
            for i in range(count)
        ]
    return ids, timezone.now()


def trigger_now(dag) -> tuple[int, datetime]:
    """One manual run, as `trigger_dag` and the API create it: started and its ready tasks
    dispatched at once by this process. Returns its id and the moment before the trigger."""
    from django.utils import timezone

    from orchestrator.engine.run_creation import create_manual_run

    began = timezone.now()
    run = create_manual_run(dag, triggered_by="bench")
    return run.pk, began


def wait_for_runs(run_ids: list[int], processes: Processes, timeout: float, poll: float = 0.1) -> None:
    from orchestrator.models import DagRun
    from retries.states import UNFINISHED_RUN_STATES

    deadline = time.monotonic() + timeout
    while True:
        open_runs = DagRun.objects.filter(pk__in=run_ids, state__in=list(UNFINISHED_RUN_STATES)).count()
        if open_runs == 0:
            return
        processes.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{open_runs} of {len(run_ids)} runs still unfinished after {timeout:.0f}s")
        time.sleep(poll)


# --- figures ------------------------------------------------------------------------------------------


def seconds(later: datetime | None, earlier: datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (later - earlier).total_seconds()


def rq_utc(value: datetime | None) -> datetime | None:
    """RQ stores naive UTC timestamps."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


@dataclass
class Series:
    """One latency, in seconds, over the attempts (or runs) of a phase."""

    label: str
    values: list[float] = field(default_factory=list)

    def add(self, value: float | None) -> None:
        if value is not None:
            self.values.append(value)

    def median_ms(self) -> float:
        return statistics.median(self.values) * 1000 if self.values else float("nan")

    def p95_ms(self) -> float:
        """Nearest-rank 95th percentile."""
        if not self.values:
            return float("nan")
        ordered = sorted(self.values)
        return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] * 1000

    def max_ms(self) -> float:
        return max(self.values) * 1000 if self.values else float("nan")

    def row(self) -> str:
        return (
            f"  {self.label:<58} {self.median_ms():9.1f} {self.p95_ms():9.1f} {self.max_ms():9.1f}"
            f"   (n={len(self.values)})"
        )

    def summary(self) -> dict[str, float | int]:
        return {"median_ms": round(self.median_ms(), 2), "p95_ms": round(self.p95_ms(), 2), "max_ms": round(self.max_ms(), 2), "n": len(self.values)}


def print_series(series: list[Series]) -> None:
    print(f"  {'':<58} {'median':>9} {'p95':>9} {'max':>9}   (ms)")
    for one in series:
        if one.values:
            print(one.row())


@dataclass
class PhaseResult:
    name: str
    runs: int
    tasks: int
    wall: float  # the first trigger -> the last run's end (see run_once in workloads.py for another way)
    failed_tasks: int
    failed_runs: int
    series: dict[str, Series]
    per_worker: dict[str, int] = field(default_factory=dict)  # attempts each worker ran
    attempts: int = 0
    wall_by_rows: float | None = None  # set when `wall` was observed instead
    failed_attempts: dict[str, int] = field(default_factory=dict)  # by category/reason
    rate_by_tenth: list[float] = field(default_factory=list)  # tasks/s ended in each tenth of the wall

    @property
    def tasks_per_second(self) -> float:
        return self.tasks / self.wall if self.wall > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "tasks": self.tasks,
            "wall_s": round(self.wall, 3),
            "wall_by_rows_s": round(self.wall_by_rows, 3) if self.wall_by_rows is not None else None,
            "tasks_per_s": round(self.tasks_per_second, 2),
            "failed_tasks": self.failed_tasks,
            "failed_runs": self.failed_runs,
            "per_worker": self.per_worker,
            "attempts": self.attempts,
            "failed_attempts": self.failed_attempts,
            "rate_by_tenth": self.rate_by_tenth,
            "latencies": {key: one.summary() for key, one in self.series.items() if one.values},
        }


def measure(name: str, triggered: dict[int, datetime]) -> PhaseResult:
    """Read a phase's figures back from the TaskAttempt/TaskInstance rows and the RQ job hashes;
    `triggered` maps each run's id to the moment it was triggered. Edges (upstream end ->
    downstream) follow each task's `upstream`, between the attempts that succeeded last."""
    from rq.job import Job

    from orchestrator.foundation.redis_conn import get_redis
    from orchestrator.models import DagRun, TaskAttempt, TaskInstance, job_id_for
    from retries.states import RunState, TaskState

    run_ids = list(triggered)
    runs = list(DagRun.objects.filter(pk__in=run_ids))
    instances = list(TaskInstance.objects.filter(dag_run_id__in=run_ids).select_related("definition"))
    attempts = list(TaskAttempt.objects.filter(task_instance__dag_run_id__in=run_ids).order_by("attempt_token"))
    jobs = Job.fetch_many([job_id_for(a.task_instance_id, a.attempt_token) for a in attempts], connection=get_redis())
    s = {
        key: Series(label)
        for key, label in (
            ("run_start", "trigger -> run started"),
            ("dispatch", "dispatch: attempt queued_at -> start_date"),
            ("to_worker", "  queued_at -> a worker took the RQ job"),
            ("startup", "  worker took the job -> start_date (claim, spawn, setup)"),
            ("run", "run: attempt start_date -> end_date"),
            ("busy", "worker busy per job (RQ started_at -> ended_at)"),
            ("edge_queued", "upstream end -> downstream queued_at"),
            ("edge_taken", "upstream end -> a worker took the downstream job"),
            ("edge_start", "upstream end -> downstream start_date"),
            ("run_end", "last task end -> run end_date"),
        )
    }
    per_worker: dict[str, int] = {}
    failed_attempts: dict[str, int] = {}
    last: dict[int, tuple[Any, Any]] = {}  # task instance -> its last attempt and RQ job
    for run in runs:
        s["run_start"].add(seconds(run.start_date, triggered[run.pk]))
    for attempt, job in zip(attempts, jobs):
        last[attempt.task_instance_id] = (attempt, job)
        per_worker[attempt.worker_name] = per_worker.get(attempt.worker_name, 0) + 1
        if attempt.state == TaskAttempt.State.FAILED:
            why = f"{(attempt.context or {}).get('category')}/{(attempt.context or {}).get('reason')}"
            failed_attempts[why] = failed_attempts.get(why, 0) + 1
        s["dispatch"].add(seconds(attempt.start_date, attempt.queued_at))
        s["run"].add(seconds(attempt.end_date, attempt.start_date))
        if job is not None:
            s["to_worker"].add(seconds(rq_utc(job.started_at), attempt.queued_at))
            s["startup"].add(seconds(attempt.start_date, rq_utc(job.started_at)))
            s["busy"].add(seconds(rq_utc(job.ended_at), rq_utc(job.started_at)))
    # A run's task instances by task id: a mapped task has one per instance.
    by_run: dict[int, dict[str, list[Any]]] = {}
    for ti in instances:
        by_run.setdefault(ti.dag_run_id, {}).setdefault(ti.task_id, []).append(ti)
    for run in runs:
        tis = by_run.get(run.pk, {})
        for ti in (ti for same_task in tis.values() for ti in same_task):
            upstream = [u for task_id in (ti.definition.upstream if ti.definition else []) for u in tis.get(task_id, [])]
            ends = [last[u.pk][0].end_date for u in upstream if u.pk in last]
            if not upstream or len(ends) < len(upstream) or None in ends or ti.pk not in last:
                continue
            attempt, job = last[ti.pk]
            s["edge_queued"].add(seconds(attempt.queued_at, max(ends)))
            s["edge_taken"].add(seconds(rq_utc(job.started_at) if job else None, max(ends)))
            s["edge_start"].add(seconds(attempt.start_date, max(ends)))
        ends = [ti.end_date for same_task in tis.values() for ti in same_task if ti.end_date is not None]
        if ends:
            s["run_end"].add(seconds(run.end_date, max(ends)))
    # A report takes its time before it waits for the run's lock: the latest of the runs' and the
    # tasks' end times is the end.
    ends = [run.end_date for run in runs if run.end_date is not None] + [ti.end_date for ti in instances if ti.end_date]
    wall = seconds(max(ends), min(triggered.values())) if ends else float("nan")
    task_ends = [seconds(ti.end_date, min(triggered.values())) for ti in instances if ti.end_date is not None]
    return PhaseResult(
        name=name,
        runs=len(runs),
        tasks=len(instances),
        wall=wall or 0.0,
        failed_tasks=sum(1 for ti in instances if ti.state != TaskState.SUCCESS),
        failed_runs=sum(1 for run in runs if run.state != RunState.SUCCESS),
        series=s,
        per_worker=per_worker,
        attempts=len(attempts),
        failed_attempts=failed_attempts,
        rate_by_tenth=rate_by_tenth(task_ends, wall or 0.0),
    )


def rate_by_tenth(ends: list[float], wall: float) -> list[float]:
    """Tasks/s in each tenth of a phase's wall time, from each task's end (seconds since the
    trigger): a rate that falls as a run goes on shows a cost that grows with what it did."""
    if wall <= 0 or not ends:
        return []
    tenth = wall / 10
    counts = [0] * 10
    for end in ends:
        counts[min(9, max(0, int(end / tenth)))] += 1
    return [round(count / tenth, 1) for count in counts]


def print_phase(result: PhaseResult) -> None:
    print(
        f"\n== {result.name}: {result.runs} runs, {result.tasks} tasks in {result.wall:.2f} s "
        f"({result.tasks_per_second:.2f} tasks/s); failed tasks {result.failed_tasks}, failed runs {result.failed_runs}"
    )
    if result.attempts != result.tasks or result.failed_attempts:
        print(f"  {result.attempts} attempts for {result.tasks} tasks; failed attempts: {result.failed_attempts}")
    if result.rate_by_tenth:
        print(f"  tasks/s in each tenth of the wall time: {', '.join(f'{rate:g}' for rate in result.rate_by_tenth)}")
    print_series(list(result.series.values()))
