"""Benchmark: the engine end to end, one scheduler and N workers running no-op tasks.

    .venv/bin/python bench/engine_throughput.py --backend postgres
    .venv/bin/python bench/engine_throughput.py --backend sqlite

`--backend postgres` creates a throwaway database on the PostgreSQL server named by
DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres) and claims an empty Redis
database (1-15) on REDIS_URL's server (default redis://127.0.0.1:6379); both are dropped or
flushed at the end. `--backend sqlite` uses a temporary SQLite file with the project's default
settings (WAL, IMMEDIATE transactions, busy timeout) and the embedded redis-server; both are
removed at the end. It checks that one scheduler and N workers share the file without
"database is locked" errors.

The script migrates, creates the DAGs with the ORM, starts `manage.py run_scheduler` and
`--workers` `manage.py run_worker` processes, and runs these phases:

  * warm-up: one diamond run, not measured;
  * unloaded: `--latency-runs` diamond runs one after the other (per-task overhead without a backlog);
  * diamond: `--runs` runs of a 4-task diamond of `bash_command: "true"` triggered at once;
  * fan-out: `--fanout-runs` runs of `--fanout` independent python no-op tasks triggered at once;
  * idle pass: with the processes stopped, `schedule_once()` over `--idle-runs` running runs
    that have nothing to do (the scheduler's cost per pass).

Each phase prints its wall time, tasks/s and median/p95/max of: dispatch latency (attempt
queued_at -> start_date, split at the moment RQ handed the job to a worker), run time of the
no-op (start_date -> end_date), the worker's busy time per job, and for the diamond the
upstream-end -> downstream-queued/start latency. At the end: failed tasks, "database is
locked" / OperationalError lines in the processes' logs, and each process's peak RSS (VmHWM)
and CPU time (a worker's includes the task processes it started).
The exit status is 1 if a run did not succeed or a log shows a database error.
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.throwaway import claimed_redis, throwaway_postgres  # noqa: E402

DIAMOND = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}
NOOP = "bench.engine_throughput.noop"
LOG_ALARMS = ("database is locked", "OperationalError")
LOG_NOTABLE = ("Traceback", " ERROR ", " CRITICAL ")


def noop() -> None:
    """The python task of the fan-out phase: does nothing, so what is measured is the engine."""
    return None


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("postgres", "sqlite"), required=True)
    parser.add_argument("--workers", type=int, default=2, help="run_worker processes (default 2)")
    parser.add_argument("--runs", type=int, default=40, help="diamond runs triggered at once (default 40)")
    parser.add_argument("--fanout-runs", type=int, default=4, help="fan-out runs triggered at once (default 4)")
    parser.add_argument("--fanout", type=int, default=10, help="independent python no-op tasks per fan-out run (default 10)")
    parser.add_argument("--latency-runs", type=int, default=3, help="diamond runs one after the other (default 3)")
    parser.add_argument("--idle-runs", type=int, default=1000, help="unfinished runs for the idle pass (default 1000)")
    parser.add_argument("--interval", type=float, default=0.2, help="ORCHESTRATOR_SCHEDULER_INTERVAL (default 0.2)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for one phase (default 600)")
    parser.add_argument("--keep-logs", action="store_true", help="copy the processes' logs to ./bench-logs-<backend>")
    args = parser.parse_args()
    if args.workers < 1 or args.runs < 0 or args.fanout_runs < 0 or args.fanout < 1 or args.idle_runs < 0:
        parser.error("--workers and --fanout must be at least 1; the run counts must not be negative")
    return args


# --- throwaway database and Redis ---------------------------------------------------------------


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


class Processes:
    """The scheduler and the workers, each logging to a file; all stopped on exit, whatever happens."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.children: list[Child] = []

    def start(self, name: str, *args: str) -> Child:
        from orchestrator.local.embedded_redis import die_with_parent

        child = Child(name, list(args), self.log_dir / f"{name}.log")
        with open(child.log_path, "wb") as log:
            child.process = subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), *args],
                env=self.env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches only this script, which stops each child
                preexec_fn=die_with_parent,  # and if this script is killed outright, they go too
            )
        self.children.append(child)
        return child

    def dead(self) -> Child | None:
        return next((c for c in self.children if c.process is not None and c.process.poll() is not None), None)

    def usage(self) -> dict[str, tuple[int, float, float]]:
        """Per live process: peak RSS in KiB, its own CPU seconds, and its reaped children's
        (for a worker: the task processes it started)."""
        return {
            c.name: (vm_hwm_kib(c.process.pid), *cpu_seconds(c.process.pid))
            for c in self.children
            if c.process is not None and c.process.poll() is None
        }

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to each (workers finish their job, the scheduler its pass), SIGKILL to the group after `timeout`."""
        running = [c for c in self.children if c.process is not None and c.process.poll() is None]
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

    def scan_logs(self) -> tuple[dict[str, list[str]], list[str]]:
        """Lines naming a database error (the alarms) and other errors, over every log."""
        alarms: dict[str, list[str]] = {pattern: [] for pattern in LOG_ALARMS}
        notable: list[str] = []
        for child in self.children:
            text = child.log_path.read_text(errors="replace") if child.log_path.exists() else ""
            for line in text.splitlines():
                for pattern in LOG_ALARMS:
                    if pattern in line:
                        alarms[pattern].append(f"{child.name}: {line.strip()}")
                if any(p in line for p in LOG_NOTABLE):
                    notable.append(f"{child.name}: {line.strip()}")
        return alarms, notable


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(utime + stime, cutime + cstime) of `pid` from /proc/PID/stat, in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def vm_hwm_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


# --- DAGs and runs ----------------------------------------------------------------------------------


def make_dag(dag_id: str, tasks: dict[str, list[str]], *, bash: bool, max_active_runs: int):
    from orchestrator.models import Dag, Task

    dag = Dag.objects.create(dag_id=dag_id, schedule=None, max_active_runs=max(1, max_active_runs))
    for position, (task_id, upstream) in enumerate(tasks.items()):
        Task.objects.create(
            dag=dag,
            task_id=task_id,
            bash_command="true" if bash else "",
            python_callable="" if bash else NOOP,
            upstream=upstream,
            position=position,
        )
    return dag


def trigger(dag, count: int) -> tuple[list[int], datetime]:
    """Create `count` queued runs in one transaction (the scheduler starts them); return their ids
    and the commit time, the moment they became visible."""
    from django.db import transaction
    from django.utils import timezone

    from orchestrator.engine.runs import create_run
    from orchestrator.models import DagRun

    now = timezone.now()
    with transaction.atomic():
        ids = [
            create_run(dag, run_type=DagRun.RunType.MANUAL, logical_date=now + timedelta(microseconds=i), now=now, triggered_by="bench").pk
            for i in range(count)
        ]
    return ids, timezone.now()


def wait_for_runs(run_ids: list[int], processes: Processes, timeout: float) -> None:
    from orchestrator.models import DagRun
    from retries.states import RunState

    deadline = time.monotonic() + timeout
    while True:
        open_runs = DagRun.objects.filter(pk__in=run_ids, state__in=[RunState.QUEUED, RunState.RUNNING]).count()
        if open_runs == 0:
            return
        dead = processes.dead()
        if dead is not None:
            tail = dead.log_path.read_text(errors="replace").splitlines()[-20:]
            raise RuntimeError(f"{dead.name} exited with code {dead.process.returncode}:\n" + "\n".join(tail))
        if time.monotonic() > deadline:
            raise RuntimeError(f"{open_runs} of {len(run_ids)} runs still unfinished after {timeout:.0f}s")
        time.sleep(0.1)


# --- figures ------------------------------------------------------------------------------------------


def seconds(later: datetime | None, earlier: datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (later - earlier).total_seconds()


def rq_utc(value: datetime | None) -> datetime | None:
    """RQ stores naive UTC timestamps."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=dt_timezone.utc)


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

    def row(self) -> str:
        return (
            f"  {self.label:<58} {self.median_ms():9.1f} {self.p95_ms():9.1f} {max(self.values) * 1000:9.1f}"
            f"   (n={len(self.values)})"
        )


@dataclass
class PhaseResult:
    name: str
    runs: int
    tasks: int
    wall: float
    failed_tasks: int
    failed_runs: int
    series: dict[str, Series]

    @property
    def tasks_per_second(self) -> float:
        return self.tasks / self.wall if self.wall > 0 else float("nan")


def measure(name: str, triggered: dict[int, datetime]) -> PhaseResult:
    """Read the phase's figures back from TaskAttempt/TaskInstance rows and the RQ job hashes;
    `triggered` maps each run's id to the moment its creation was committed."""
    from rq.job import Job

    from orchestrator.models import DagRun, TaskAttempt, TaskInstance, job_id_for
    from orchestrator.redis_conn import get_redis
    from retries.states import RunState, TaskState

    run_ids = list(triggered)
    runs = list(DagRun.objects.filter(pk__in=run_ids))
    instances = list(TaskInstance.objects.filter(dag_run_id__in=run_ids))
    attempts = list(TaskAttempt.objects.filter(task_instance__dag_run_id__in=run_ids))
    jobs = Job.fetch_many([job_id_for(a.task_instance_id, a.attempt_token) for a in attempts], connection=get_redis())
    s = {
        key: Series(label)
        for key, label in (
            ("run_start", "trigger -> run started (scheduler pass)"),
            ("dispatch", "dispatch: attempt queued_at -> start_date"),
            ("to_worker", "  queued_at -> a worker took the RQ job"),
            ("startup", "  worker took the job -> start_date (claim, spawn, setup)"),
            ("run", "run: attempt start_date -> end_date"),
            ("busy", "worker busy per job (RQ started_at -> ended_at)"),
            ("edge_queued", "upstream end -> downstream queued_at"),
            ("edge_start", "upstream end -> downstream start_date"),
            ("run_end", "last task end -> run end_date"),
        )
    }
    for run in runs:
        s["run_start"].add(seconds(run.start_date, triggered[run.pk]))
    for attempt, job in zip(attempts, jobs):
        s["dispatch"].add(seconds(attempt.start_date, attempt.queued_at))
        s["run"].add(seconds(attempt.end_date, attempt.start_date))
        if job is not None:
            s["to_worker"].add(seconds(rq_utc(job.started_at), attempt.queued_at))
            s["startup"].add(seconds(attempt.start_date, rq_utc(job.started_at)))
            s["busy"].add(seconds(rq_utc(job.ended_at), rq_utc(job.started_at)))
    by_run: dict[int, dict[str, Any]] = {}
    for ti in instances:
        by_run.setdefault(ti.dag_run_id, {})[ti.task_id] = ti
    for run in runs:
        tis = by_run.get(run.pk, {})
        for ti in tis.values():
            upstream = [tis[u] for u in DIAMOND.get(ti.task_id, []) if u in tis] if set(tis) == set(DIAMOND) else []
            if not upstream or any(u.end_date is None for u in upstream):
                continue
            upstream_end = max(u.end_date for u in upstream)
            s["edge_queued"].add(seconds(ti.queued_at, upstream_end))
            s["edge_start"].add(seconds(ti.start_date, upstream_end))
        ends = [ti.end_date for ti in tis.values() if ti.end_date is not None]
        if ends:
            s["run_end"].add(seconds(run.end_date, max(ends)))
    ends = [run.end_date for run in runs if run.end_date is not None]
    wall = seconds(max(ends), min(triggered.values())) if ends else float("nan")
    return PhaseResult(
        name=name,
        runs=len(runs),
        tasks=len(instances),
        wall=wall or 0.0,
        failed_tasks=sum(1 for ti in instances if ti.state != TaskState.SUCCESS),
        failed_runs=sum(1 for run in runs if run.state != RunState.SUCCESS),
        series=s,
    )


def print_phase(result: PhaseResult) -> None:
    print(
        f"\n== {result.name}: {result.runs} runs, {result.tasks} tasks in {result.wall:.2f} s "
        f"({result.tasks_per_second:.2f} tasks/s); failed tasks {result.failed_tasks}, failed runs {result.failed_runs}"
    )
    print(f"  {'':<58} {'median':>9} {'p95':>9} {'max':>9}   (ms)")
    for series in result.series.values():
        if series.values:
            print(series.row())


def run_phase(name: str, dag, count: int, processes: Processes, timeout: float) -> PhaseResult:
    run_ids, started = trigger(dag, count)
    wait_for_runs(run_ids, processes, timeout)
    result = measure(name, dict.fromkeys(run_ids, started))
    print_phase(result)
    return result


def run_sequentially(name: str, dag, count: int, processes: Processes, timeout: float) -> PhaseResult:
    """One run at a time: the per-task overhead with no backlog in front of the workers."""
    triggered: dict[int, datetime] = {}
    for _ in range(count):
        run_ids, started = trigger(dag, 1)
        wait_for_runs(run_ids, processes, timeout)
        triggered.update(dict.fromkeys(run_ids, started))
    result = measure(name, triggered)
    print_phase(result)
    return result


# --- the scheduler's idle pass -------------------------------------------------------------------------


def idle_pass(count: int, repeats: int = 3) -> dict[str, float]:
    """Time schedule_once() over `count` running diamond runs whose root task is running (fresh
    heartbeat) and whose other tasks wait: every pass reads them all and changes nothing."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from orchestrator.engine import scheduler
    from orchestrator.engine.clock import Now
    from orchestrator.models import DagRun, TaskInstance
    from retries.states import RunState, TaskState

    dag = make_dag("bench_idle", DIAMOND, bash=True, max_active_runs=count + 1)
    tasks = {t.task_id: t for t in dag.tasks.all()}
    now = timezone.now()
    runs = DagRun.objects.bulk_create(
        [
            DagRun(dag=dag, run_id=f"idle__{i}", run_type=DagRun.RunType.MANUAL, state=RunState.RUNNING,
                   logical_date=now + timedelta(microseconds=i), queued_at=now, start_date=now)
            for i in range(count)
        ],
        batch_size=500,
    )
    instances = []
    for run in runs:
        for task_id, task in tasks.items():
            root = task_id == "a"
            instances.append(
                TaskInstance(dag_run=run, definition=task, task_id=task_id,
                             state=TaskState.RUNNING if root else TaskState.NONE,
                             attempt_token=1 if root else 0, try_number=1 if root else 0,
                             queued_at=now if root else None, start_date=now if root else None,
                             heartbeat_at=now if root else None)
            )
    TaskInstance.objects.bulk_create(instances, batch_size=1000)
    running = TaskInstance.objects.filter(dag_run__dag=dag, state=TaskState.RUNNING)

    def timed(step, count_queries: bool = False) -> tuple[float, list[dict[str, str]], Any]:
        running.update(heartbeat_at=Now())  # fresh, so the pass finds no lost task
        with ExitStack() as stack:
            capture = stack.enter_context(CaptureQueriesContext(connection)) if count_queries else None
            began = time.perf_counter()
            result = step()
            elapsed = time.perf_counter() - began
        return elapsed, list(capture.captured_queries) if capture else [], result

    # The last pass also records its queries (and their time): a small cost next to the pass.
    passes = [timed(scheduler.schedule_once, count_queries=n == repeats - 1) for n in range(repeats)]
    changed = [r for _, _, r in passes if r.tasks_dispatched or r.runs_finished or r.runs_created or r.lost]
    if changed:
        print(f"WARNING: an idle pass changed something: {changed[0]}")
    queries = passes[-1][1]
    sql_seconds = sum(float(q["time"]) for q in queries)
    at = timezone.now()
    lost = [timed(lambda: scheduler._find_lost_tasks(at, scheduler.PassReport())) for _ in range(repeats)]
    # SQLite reads rows after execute() returns, so only PostgreSQL's query times add up.
    sql_note = f", {sql_seconds * 1000:.0f} ms of it in the database calls" if connection.vendor == "postgresql" else ""
    figures = {
        "pass_ms": statistics.median(p[0] for p in passes) * 1000,
        "pass_min_ms": min(p[0] for p in passes) * 1000,
        "queries": len(queries),
        "sql_ms": sql_seconds * 1000,
        "lost_ms": statistics.median(p[0] for p in lost) * 1000,
    }
    print(
        f"\n== idle scheduler pass over {count} running runs with nothing to do (median of {repeats} passes):\n"
        f"  schedule_once()                 {figures['pass_ms']:9.1f} ms  (min {figures['pass_min_ms']:.1f}; "
        f"{figures['pass_ms'] / max(count, 1):.2f} ms per run)\n"
        f"    queries in one pass           {figures['queries']:9d}     ({figures['queries'] / max(count, 1):.1f} per run)"
        f"{sql_note}\n"
        f"    of which _find_lost_tasks     {figures['lost_ms']:9.1f} ms"
    )
    return figures


# --- main ----------------------------------------------------------------------------------------------


def child_env(database_url: str, redis_url: str, interval: float) -> dict[str, str]:
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
        ORCHESTRATOR_SCHEDULER_INTERVAL=str(interval),
        # Idle workers stop at once; these only bound a stop that catches a task mid-run.
        ORCHESTRATOR_WORKER_SHUTDOWN_GRACE="5",
        ORCHESTRATOR_KILL_GRACE="1",
    )
    return env


def main() -> int:
    args = parse_args()
    # Clean up on Ctrl-C or SIGTERM, also when started where SIGINT is ignored (a background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    machine = f"{os.cpu_count()} CPUs"
    with ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix=f"engine-bench-{args.backend}-"))
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        log_dir = workdir / "logs"
        log_dir.mkdir()
        if args.backend == "postgres":
            server_url = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
            database_url = stack.enter_context(throwaway_postgres(server_url, "engine_bench"))
            redis_url = stack.enter_context(claimed_redis(os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379"))
        else:
            database_url = f"sqlite:///{workdir / 'bench.sqlite3'}"
            redis_url = stack.enter_context(embedded_redis(workdir / "redis"))
        env = child_env(database_url, redis_url, args.interval)
        os.environ.update({k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "SECRET_KEY", "DEBUG")})
        os.environ["LOG_LEVEL"] = "WARNING"  # this process's own scheduler pass must not log per run
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection, connections

        call_command("migrate", verbosity=0)
        vendor = f"PostgreSQL {connection.pg_version}" if connection.vendor == "postgresql" else f"SQLite {connection.Database.sqlite_version}"
        print(f"{vendor}, Redis at {redis_url}; {machine}; {args.workers} workers, scheduler interval {args.interval}s")

        warmup_dag = make_dag("bench_warmup", DIAMOND, bash=True, max_active_runs=1)
        latency_dag = make_dag("bench_latency", DIAMOND, bash=True, max_active_runs=1)
        diamond_dag = make_dag("bench_diamond", DIAMOND, bash=True, max_active_runs=args.runs)
        fanout_dag = make_dag(
            "bench_fanout", {f"noop_{i}": [] for i in range(args.fanout)}, bash=False, max_active_runs=args.fanout_runs
        )
        connections.close_all()  # SQLite: hold no lock or snapshot while the children start

        processes = Processes(env, log_dir)
        if args.keep_logs:  # runs after the processes stopped (callbacks run last-in, first-out)
            stack.callback(shutil.copytree, log_dir, ROOT / f"bench-logs-{args.backend}", dirs_exist_ok=True)
        stack.callback(processes.stop)
        processes.start("scheduler", "run_scheduler")
        for n in range(1, args.workers + 1):
            processes.start(f"worker-{n}", "run_worker", "--name", f"bench-worker-{n}-{os.getpid()}")

        results: list[PhaseResult] = []
        began = time.monotonic()
        run_phase("warm-up (not counted)", warmup_dag, 1, processes, args.timeout)
        if args.latency_runs:
            results.append(run_sequentially(f"unloaded: {args.latency_runs} diamond runs one at a time", latency_dag,
                                            args.latency_runs, processes, args.timeout))
        if args.runs:
            results.append(run_phase(f"diamond: {args.runs} runs x 4 bash tasks at once", diamond_dag, args.runs, processes,
                                     args.timeout))
        if args.fanout_runs:
            results.append(run_phase(f"fan-out: {args.fanout_runs} runs x {args.fanout} python no-op tasks at once",
                                     fanout_dag, args.fanout_runs, processes, args.timeout))
        engine_seconds = time.monotonic() - began
        usage = processes.usage()
        processes.stop()
        alarms, notable = processes.scan_logs()
        connections.close_all()

        idle = idle_pass(args.idle_runs) if args.idle_runs else None

        failed_tasks = sum(r.failed_tasks for r in results)
        failed_runs = sum(r.failed_runs for r in results)
        locked = len(alarms["database is locked"])
        operational = len(alarms["OperationalError"])
        print("\n== processes")
        for name, (kib, own_cpu, children_cpu) in usage.items():
            print(f"  {name:<12} peak RSS (VmHWM) {kib / 1024:6.1f} MiB, CPU {own_cpu:6.1f} s own + {children_cpu:6.1f} s children")
        print(f"  log lines with 'database is locked': {locked}, with 'OperationalError': {operational}")
        for line in (alarms["database is locked"] + alarms["OperationalError"])[:10]:
            print(f"    {line}")
        if notable:
            print(f"  other error lines in the logs: {len(notable)}")
            for line in notable[:10]:
                print(f"    {line}")
        print(f"\nengine phases took {engine_seconds:.1f} s")
        summary = [f"backend={args.backend}", f"workers={args.workers}"]
        for result in results:
            key = result.name.split(":")[0]
            summary += [
                f"{key}_tasks_per_s={result.tasks_per_second:.2f}",
                f"{key}_dispatch_p50_ms={result.series['dispatch'].median_ms():.0f}",
                f"{key}_startup_p50_ms={result.series['startup'].median_ms():.0f}",
                f"{key}_run_p50_ms={result.series['run'].median_ms():.0f}",
            ]
        if idle:
            summary.append(f"idle_pass_ms={idle['pass_ms']:.1f}")
        worker_rss = [kib for name, (kib, _, _) in usage.items() if name.startswith("worker")]
        if worker_rss:
            summary.append(f"worker_peak_rss_mib={max(worker_rss) / 1024:.1f}")
        summary += [f"failed_tasks={failed_tasks}", f"locked_lines={locked}", f"operational_error_lines={operational}"]
        print("summary: " + " ".join(summary))
        if failed_tasks or failed_runs or locked or operational:
            print("FAILED: every run should succeed and no process should log a database error")
            return 1
        return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit("interrupted: processes stopped, database and Redis cleaned up")
