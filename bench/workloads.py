"""The workloads of `python -m bench`, each returning its figures (see bench/__main__.py)."""
from __future__ import annotations

import os
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from bench import memory, procfs
from bench.profiles import Profiler, summarize
from bench.scheduler_pass import (
    CLAIMED,
    QUEUED,
    RUNNING,
    populate,
    print_passes,
    time_passes,
)
from bench.stack import (
    MANAGE,
    Child,
    PhaseResult,
    Processes,
    make_dag,
    measure,
    print_phase,
    trigger_now,
    wait_for_rq_workers,
    wait_for_runs,
)

SLEEP = "bench.tasks.sleep"
STAMP = "bench.tasks.stamp"


@dataclass
class Context:
    args: Any  # the parsed command line
    processes: Processes
    workdir: Path
    original_env: dict[str, str]  # as the benchmark was started, before it pointed at its database
    profile_dir: Path | None = None
    scheduler: Child | None = None
    workers: list[Child] = field(default_factory=list)
    worker_concurrency: int | None = None


# --- the engine's processes --------------------------------------------------------------------


def ensure_stack(ctx: Context, concurrency: int | None) -> None:
    """One scheduler, and `--workers` workers at `concurrency` (None: the project's default),
    registered and warm: a first run of a few tasks of each kind went through every worker."""
    if ctx.scheduler is None:
        ctx.scheduler = ctx.processes.start("scheduler", "run_scheduler")
    if ctx.workers and ctx.worker_concurrency == concurrency:
        return
    if ctx.workers:
        ctx.processes.stop(ctx.workers)
    suffix = f"c{concurrency}" if concurrency else "default"
    names = [f"bench-{suffix}-{n}-{os.getpid()}" for n in range(1, ctx.args.workers + 1)]
    extra = ["--concurrency", str(concurrency)] if concurrency else []
    ctx.workers = [
        ctx.processes.start(f"worker-{suffix}-{n}", "run_worker", "--name", name, *extra) for n, name in enumerate(names, 1)
    ]
    ctx.worker_concurrency = concurrency
    wait_for_rq_workers(names, ctx.processes)
    from orchestrator.models import Dag

    warm = 4 * len(names)
    for kind, bash in (("py", None), ("bash", "true")):
        dag_id = f"bench_warmup_{suffix}_{kind}"  # made once, run again by a stack started anew
        dag = Dag.objects.filter(dag_id=dag_id).first() or make_dag(dag_id, {f"t{i}": [] for i in range(warm)}, bash=bash)
        run_id, _ = trigger_now(dag)
        wait_for_runs([run_id], ctx.processes, ctx.args.timeout, poll=0.05)


def stop_stack(ctx: Context) -> None:
    ctx.processes.stop([c for c in (ctx.scheduler, *ctx.workers) if c is not None])
    ctx.scheduler, ctx.workers, ctx.worker_concurrency = None, [], None


class CpuMeter:
    """CPU seconds spent by each process of the stack (and the database's server processes for
    this database) between start() and stop(), and by the whole machine."""

    def __init__(self, ctx: Context) -> None:
        self.labels: dict[int, str] = {os.getpid(): "bench (trigger, polling)"}
        if ctx.scheduler is not None:
            self.labels[ctx.scheduler.pid] = "scheduler"
        for worker in ctx.workers:
            self.labels[worker.pid] = worker.name
            for server in memory.worker_members(worker.pid)["fork_server"]:
                self.labels[server] = f"{worker.name} fork server + tasks"

    @staticmethod
    def _backends() -> list[int]:
        from django.db import connection

        with connection.cursor() as cursor:
            if connection.vendor != "postgresql":
                return []
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
            return [row[0] for row in cursor.fetchall()]

    @staticmethod
    def _read(pids: list[int]) -> dict[int, float]:
        return {pid: sum(procfs.cpu_seconds(pid)) for pid in pids}

    def start(self) -> None:
        self.backends = self._backends()
        self.before = self._read(list(self.labels) + self.backends)
        self.machine_before = procfs.machine_cpu()
        self.began = time.monotonic()

    def stop(self) -> dict[str, Any]:
        after = self._read(list(self.before))
        busy = procfs.machine_cpu()[0] - self.machine_before[0]
        wall = time.monotonic() - self.began
        used = {label: round(after[pid] - self.before[pid], 2) for pid, label in self.labels.items()}
        used["postgres backends of this database"] = round(sum(after[p] - self.before[p] for p in self.backends), 2)
        ours = sum(used.values())
        return {"wall_s": round(wall, 2), "machine_busy_cpu_s": round(busy, 2), "cpus": os.cpu_count(), "by_process_cpu_s": used,
                "ours_cpu_s": round(ours, 2), "others_cpu_s": round(max(0.0, busy - ours), 2)}


def print_cpu(cpu: dict[str, Any]) -> None:
    capacity = cpu["wall_s"] * (cpu["cpus"] or 1)
    print(f"  CPU over {cpu['wall_s']:.2f} s: machine busy {cpu['machine_busy_cpu_s']:.2f} s of {capacity:.2f} s available; "
          f"these processes {cpu['ours_cpu_s']:.2f} s, everything else on the machine (other work, Redis, the kernel) "
          f"{cpu['others_cpu_s']:.2f} s")
    for label, used in cpu["by_process_cpu_s"].items():
        print(f"    {label:<44} {used:7.2f} s")


def profile_stack(ctx: Context, name: str) -> Profiler | None:
    if ctx.profile_dir is None:
        return None
    profiler = Profiler(ctx.profile_dir)
    profiler.start(f"{name}-bench", os.getpid())
    if ctx.scheduler is not None:
        profiler.start(f"{name}-scheduler", ctx.scheduler.pid)
    for worker in ctx.workers:
        profiler.start(f"{name}-{worker.name}", worker.pid)
        for server in memory.worker_members(worker.pid)["fork_server"]:
            profiler.start(f"{name}-{worker.name}-forkserver", server, subprocesses=True)
    time.sleep(1.0)  # py-spy attaches
    return profiler


def finish_profile(profiler: Profiler | None) -> list[str]:
    if profiler is None:
        return []
    paths = profiler.stop()
    for path in paths:
        print(summarize(path))
    return [str(p) for p in paths]


def run_once(ctx: Context, name: str, dag, *, during: Callable[[], Any] | None = None) -> tuple[PhaseResult, dict[str, Any]]:
    """Trigger one run of `dag` as `trigger_dag` does (its ready tasks dispatched at once) and
    wait for its end; its figures come from the rows and RQ's job hashes."""
    profiler = profile_stack(ctx, name)
    meter = CpuMeter(ctx)
    if during is not None:
        during()
    meter.start()
    try:
        start = time.monotonic()
        run_id, began = trigger_now(dag)
        trigger_s = time.monotonic() - start
        wait_for_runs([run_id], ctx.processes, ctx.args.timeout)
        observed = time.monotonic() - start
    finally:
        cpu = meter.stop()
        profiles = finish_profile(profiler)
    result = measure(name, {run_id: began})
    # The wall time is the trigger -> the moment the run's end was seen (polled every 0.1 s): the
    # times in the rows are taken when a report starts, and a report may then wait long for the
    # run's lock before it commits.
    result.wall_by_rows, result.wall = result.wall, observed
    print_phase(result)
    print(f"  the trigger (in this process: the run and the dispatch of its ready tasks) took {trigger_s:.2f} s; the run was seen "
          f"done {observed:.2f} s after the trigger (by the rows' times: {result.wall_by_rows:.2f} s)")
    print(f"  attempts per worker: {result.per_worker}")
    print_cpu(cpu)
    return result, {"cpu": cpu, "trigger_s": round(trigger_s, 3), "profiles": profiles}


def failures(result: PhaseResult) -> list[str]:
    if result.failed_tasks or result.failed_runs:
        return [f"{result.failed_tasks} tasks and {result.failed_runs} runs did not succeed"]
    return []


# --- the workloads ---------------------------------------------------------------------------------


def fanout(ctx: Context, kind: str) -> dict[str, Any]:
    """`--fanout-tasks` independent no-op tasks (python, or bash `true`) in one run, `--workers`
    workers at the default concurrency; `--fanout-repeats` runs, the median counts (a 300-task
    run lasts 2-3 s, and one run's rate moves by 10 % from the next's)."""
    ensure_stack(ctx, ctx.args.concurrency)
    n = ctx.args.fanout_tasks
    bash = "true" if kind == "bash" else None
    dag = make_dag(f"bench_fanout_{kind}", {f"t{i:04d}": [] for i in range(n)}, bash=bash)
    runs = [run_once(ctx, f"fanout-{kind}", dag) for _ in range(ctx.args.fanout_repeats)]
    each = [result.tasks_per_second for result, _ in runs]
    result, extra = sorted(runs, key=lambda one: one[0].tasks_per_second)[len(runs) // 2]
    if len(runs) > 1:
        print(f"  {len(runs)} runs: {', '.join(f'{rate:.1f}' for rate in each)} tasks/s; the median counts: {result.tasks_per_second:.1f}")
    return {"tasks_per_s": result.tasks_per_second, "each_tasks_per_s": [round(rate, 2) for rate in each],
            "phase": result.to_dict(), "errors": [error for one, _ in runs for error in failures(one)], **extra}


def wide(ctx: Context) -> dict[str, Any]:
    """One run of a root, `--wide-tasks` python no-op tasks downstream of it and a sink downstream
    of them all, on `--workers` workers: the fan-out's throughput at 30 times its width (every
    middle task's report looks at the sink)."""
    ensure_stack(ctx, ctx.args.concurrency)
    n = ctx.args.wide_tasks
    middle = [f"t{i:05d}" for i in range(n)]
    dag = make_dag("bench_wide", {"root": [], **{name: ["root"] for name in middle}, "sink": middle})
    result, extra = run_once(ctx, "wide", dag)
    return {"tasks_per_s": result.tasks_per_second, "phase": result.to_dict(), "errors": failures(result), **extra}


def chain(ctx: Context) -> dict[str, Any]:
    """`--chain-length` python no-op tasks, each downstream of the one before."""
    ensure_stack(ctx, ctx.args.concurrency)
    n = ctx.args.chain_length
    dag = make_dag("bench_chain", {f"t{i:03d}": [f"t{i - 1:03d}"] if i else [] for i in range(n)})
    result, extra = run_once(ctx, "chain", dag)
    gap = result.series["edge_start"]
    return {"gap_median_ms": gap.median_ms(), "phase": result.to_dict(), "errors": failures(result), **extra}


def chain_seen(ctx: Context) -> dict[str, Any]:
    """`--chain-length` python tasks in sequence, each writing the time its code started and ended
    (`bench.tasks.stamp`): the gap from one task's last line to the next one's first, as the tasks
    see it, with nothing of the rows' own timing in it."""
    ensure_stack(ctx, ctx.args.concurrency)
    n = ctx.args.chain_length
    stamps = ctx.workdir / "chain-stamps.txt"
    stamps.unlink(missing_ok=True)
    dag = make_dag("bench_chain_seen", {f"t{i:03d}": [f"t{i - 1:03d}"] if i else [] for i in range(n)},
                   python_callable=STAMP, op_kwargs={"path": str(stamps)})
    result, extra = run_once(ctx, "chain-seen", dag)
    lines = [tuple(map(float, line.split())) for line in stamps.read_text().splitlines()]
    gaps = [(lines[k + 1][0] - lines[k][1]) * 1000 for k in range(len(lines) - 1)]
    errors = failures(result) + ([f"{len(lines)} of {n} tasks wrote their times"] if len(lines) != n else [])
    if gaps:
        print(f"  as the tasks see it, end of one -> start of the next: median {statistics.median(gaps):.1f} ms, "
              f"min {min(gaps):.1f} ms, max {max(gaps):.1f} ms over {len(gaps)} gaps")
    return {"gap_median_ms": statistics.median(gaps) if gaps else None, "gaps_ms": [round(g, 2) for g in gaps],
            "phase": result.to_dict(), "errors": errors, **extra}


def trigger_wide(ctx: Context) -> dict[str, Any]:
    """Trigger a run of `--wide-tasks` independent python no-op tasks, as `trigger_dag` does (the
    trigger dispatches every ready task), and time it to the first task's "running" handshake.
    The run is not waited for: once a task has run, the workers are stopped, the queue emptied
    and the run marked failed, so that what comes after starts from an empty queue."""
    from django.db.models import Min
    from rq import Queue

    from orchestrator.foundation.redis_conn import get_redis
    from orchestrator.models import DagRun, TaskInstance
    from retries.states import UNFINISHED_RUN_STATES, RunState, TaskState

    ensure_stack(ctx, ctx.args.concurrency)
    n = ctx.args.wide_tasks
    dag = make_dag("bench_trigger_wide", {f"t{i:05d}": [] for i in range(n)})
    meter = CpuMeter(ctx)
    meter.start()
    began_clock = time.monotonic()
    if ctx.profile_dir is not None:  # cProfile of this process: the trigger runs here
        import cProfile
        import pstats

        profile = cProfile.Profile()
        run_id, began = profile.runcall(trigger_now, dag)
        ctx.profile_dir.mkdir(parents=True, exist_ok=True)
        profile.dump_stats(ctx.profile_dir / "trigger-wide.pstats")
        pstats.Stats(profile, stream=sys.stdout).sort_stats("cumulative").print_stats(30)
    else:
        run_id, began = trigger_now(dag)
    trigger_s = time.monotonic() - began_clock
    deadline = time.monotonic() + ctx.args.timeout
    first = None
    while first is None:
        first = TaskInstance.objects.filter(dag_run_id=run_id, start_date__isnull=False).aggregate(first=Min("start_date"))["first"]
        ctx.processes.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"no task of the {n}-task run was running after {ctx.args.timeout:.0f}s")
        time.sleep(0.02)
    seen_s = time.monotonic() - began_clock
    cpu = meter.stop()
    first_s = (first - began).total_seconds()
    dispatched = TaskInstance.objects.filter(dag_run_id=run_id, state=TaskState.QUEUED).count()
    stop_stack(ctx)
    Queue("default", connection=get_redis()).empty()
    TaskInstance.objects.filter(dag_run_id=run_id).exclude(state=TaskState.SUCCESS).update(state=TaskState.FAILED)
    DagRun.objects.filter(pk=run_id, state__in=list(UNFINISHED_RUN_STATES)).update(state=RunState.FAILED)
    print(f"\n  {n} tasks: the trigger returned after {trigger_s:.2f} s (run created, every task dispatched); the first task "
          f"said running {first_s:.2f} s after the trigger began (seen at {seen_s:.2f} s); {dispatched} still queued then")
    print_cpu(cpu)
    return {"first_running_s": first_s, "trigger_s": round(trigger_s, 3), "cpu": cpu, "errors": []}


def width(ctx: Context) -> dict[str, Any]:
    """`--width-tasks` python tasks that sleep `--width-sleep` s, workers at `--width-concurrency`;
    the summed PSS of the workers, their fork servers and task processes at the peak."""
    ensure_stack(ctx, ctx.args.width_concurrency)
    n = ctx.args.width_tasks
    dag = make_dag("bench_width", {f"t{i:04d}": [] for i in range(n)}, python_callable=SLEEP,
                   op_kwargs={"seconds": ctx.args.width_sleep})
    sampler = memory.PeakPss([w.pid for w in ctx.workers], expected=n)
    try:
        result, extra = run_once(ctx, "width", dag, during=sampler.start)
    finally:
        sampler.stop()
    pss = sampler.summary()
    print(f"  peak PSS of workers + fork servers + task processes: {pss['peak_pss_mib']} MiB {pss['peak_by_kind_mib']} "
          f"(private pages {pss['peak_private_by_kind_mib']}), "
          f"{pss['task_processes_at_peak']} task processes at that sample (most seen {pss['most_task_processes_seen']}); "
          f"{pss['samples']} samples, the longest read took {pss['seconds_per_sample']} s")
    return {"wall_s": result.wall, "pss": pss, "phase": result.to_dict(), "errors": failures(result), **extra}


def scheduler_pass(ctx: Context) -> dict[str, Any]:
    """schedule_once() in this process, no scheduler or worker running, over `--sched-runs`
    running runs of `--sched-tasks` task instances each, all queued or running: 60 % running with
    a fresh heartbeat, 20 % claimed by a worker, 20 % waiting in Redis for one."""
    stop_stack(ctx)
    runs, per_run = ctx.args.sched_runs, ctx.args.sched_tasks
    kinds = {}
    for i in range(per_run):
        kinds[f"t{i:03d}"] = RUNNING if i < per_run * 0.6 else CLAIMED if i < per_run * 0.8 else QUEUED
    began = time.monotonic()
    dag = populate("bench_sched", {task_id: [] for task_id in kinds}, kinds, runs)
    print(f"\n  created {runs} runs x {per_run} task instances in {time.monotonic() - began:.1f} s")
    profiler = None
    if ctx.profile_dir is not None:
        profiler = Profiler(ctx.profile_dir, rate=250)
        profiler.start("scheduler-pass-bench", os.getpid())
        time.sleep(1.0)  # py-spy attaches
    try:
        figures = time_passes(dag, repeats=ctx.args.sched_repeats)
    finally:
        figures_profiles = finish_profile(profiler)
    print_passes(f"scheduler pass over {runs * per_run} active task instances in {runs} runs", figures, runs)
    return {**figures, "profiles": figures_profiles,
            "errors": ["a pass with nothing to do changed something"] if figures["changed"] else []}


def attempt_queries(ctx: Context) -> dict[str, Any]:
    """In this process, no worker running: the queries (and their time) of each step a worker
    takes for one attempt (claim, plan, running handshake, heartbeat, success report with the
    run's advance), and of advance_run() alone when it has nothing to do, in runs of 1 task, of
    `--fanout-tasks` and of `--width-tasks` tasks."""
    from orchestrator.engine import reporting
    from orchestrator.engine.run_advance import advance_run
    from orchestrator.engine.run_creation import create_manual_run
    from orchestrator.models import TaskInstance
    from orchestrator.worker.host.job import plan_for

    stop_stack(ctx)
    worker = reporting.WorkerInfo(hostname="bench", worker_name="bench-harness", pid=os.getpid())
    out: dict[str, Any] = {}
    for width_ in sorted({1, ctx.args.fanout_tasks, ctx.args.width_tasks}):
        dag = make_dag(f"bench_queries_{width_}", {f"t{i:04d}": [] for i in range(width_)}, max_active_runs=1000)
        samples: dict[str, list[tuple[int, float]]] = {}
        queries_of: dict[str, list[dict[str, str]]] = {}
        step = partial(_timed_step, samples, queries_of)

        for _ in range(ctx.args.query_samples if width_ == 1 else 1):
            run = step("trigger (dispatches every task)", partial(create_manual_run, dag, triggered_by="bench"))
            tis = list(TaskInstance.objects.filter(dag_run=run).order_by("pk")[: ctx.args.query_samples])
            for ti in tis:
                token = ti.attempt_token
                claimed = step("claim", partial(reporting.claim, ti.pk, token, worker))
                step("plan_for", partial(plan_for, claimed))
                step("mark_running", partial(reporting.mark_running, ti.pk, token, pid=os.getpid()))
                step("heartbeat_many (one attempt)", partial(reporting.heartbeat_many, [(ti.pk, token)]))
                step("report_success (+ advance_run)", partial(reporting.report_success, ti.pk, token, result=None))
                if width_ > 1:
                    step("advance_run alone (nothing to do)", partial(advance_run, run.pk))
        rows = {
            name: {"queries": statistics.median(q for q, _ in values), "median_ms": round(statistics.median(t for _, t in values) * 1000, 2),
                   "n": len(values)}
            for name, values in samples.items()
        }
        per_attempt = [k for k in rows if not k.startswith(("trigger", "advance_run alone"))]
        total = {"queries": sum(rows[k]["queries"] for k in per_attempt), "median_ms": round(sum(rows[k]["median_ms"] for k in per_attempt), 2)}
        print(f"\n== queries per attempt, in a run of {width_} task(s) (medians over {rows['claim']['n']} attempts)")
        for name, row in rows.items():
            print(f"  {name:<40} {row['queries']:6.0f} queries {row['median_ms']:8.2f} ms")
        print(f"  {'per attempt (claim .. report)':<40} {total['queries']:6.0f} queries {total['median_ms']:8.2f} ms")
        statements = {
            name: [f"{float(q['time']) * 1000:5.0f} ms  {q['sql'][:160]}" for q in queries_of[name]]
            for name in queries_of
        }
        shown = ["report_success (+ advance_run)"] + (["trigger (dispatches every task)"] if width_ == 1 else [])
        for name in shown:
            print(f"  the statements of the last {name} (Django times them to the millisecond):")
            for line in statements[name]:
                print(f"    {line}")
        out[str(width_)] = {"steps": rows, "per_attempt": total, "statements": statements if width_ == 1 else
                            {"report_success (+ advance_run)": statements["report_success (+ advance_run)"]}}
    return {"by_run_width": out, "errors": []}


def _timed_step(samples: dict[str, list[tuple[int, float]]], queries_of: dict[str, list[dict[str, str]]], name: str,
               function: Callable[[], Any]) -> Any:
    """Run `function`, keeping its query count and time under `name`, and its statements."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    connection.queries_log.clear()  # it keeps 9,000 queries: a big trigger would overflow it
    with CaptureQueriesContext(connection) as capture:
        began = time.perf_counter()
        value = function()
        elapsed = time.perf_counter() - began
    samples.setdefault(name, []).append((len(capture.captured_queries), elapsed))
    queries_of[name] = list(capture.captured_queries)
    return value


# --- the idle stack of `make run` -------------------------------------------------------------------

ROLES = (("runserver", "web"), ("run_scheduler", "scheduler"), ("run_worker", "worker"), ("redis-server", "redis"))


def idle_stack(ctx: Context) -> dict[str, Any]:
    """`manage.py run_local` (what `make run` starts) on a free port with its own state directory
    and SQLite file; once it is up and every run it started (the example DAGs) has ended, and
    `--settle` seconds more, the RSS of each process tree (a worker with its fork server)."""
    from orchestrator.local.embedded_redis import free_port

    home = ctx.workdir / "idle-stack"
    home.mkdir()
    database = home / "orchestrator.sqlite3"
    env = {k: v for k, v in ctx.original_env.items() if k not in ("REDIS_URL", "DEBUG", "DATABASE_URL")}
    # Its own SQLite file and spool, and a secret key: nothing written under the checkout's var/.
    env.update(DATABASE_URL=f"sqlite:///{database}", PYTHONUNBUFFERED="1", ORCHESTRATOR_SPOOL_DIR=str(home / "spool"),
               SECRET_KEY=env.get("SECRET_KEY") or "bench-only")
    port = free_port()
    runner = ctx.processes.start_command(
        "run-local", [sys.executable, str(MANAGE), "run_local", "--port", str(port), "--state-dir", str(home / "var")], env=env
    )
    members: dict[int, str] = {}
    try:
        up = wait_for_line(ctx, runner, "is running at", ctx.args.timeout)
        print(f"\n  run_local is up after {up:.1f} s (port {port}); waiting for its runs to end and {ctx.args.settle:.0f} s more")
        wait_unfinished_runs(ctx, database, runner)
        time.sleep(ctx.args.settle)
        samples = []
        for _ in range(3):
            samples.append(stack_rss(runner.pid))
            time.sleep(1.0)
        sample = max(samples, key=lambda s: s["total_mib"])
        members = {pid: cmd for pid, cmd in sample.pop("pids").items()}
    finally:
        ctx.processes.stop([runner], timeout=90)
        kill_leftovers(members)
    print(f"  idle stack RSS: {sample['total_mib']:.1f} MiB in all (PSS {sample['total_pss_mib']:.1f} MiB)")
    for name, row in sample["trees"].items():
        each = f": {' + '.join(str(x) for x in row['rss_mib_each'])} MiB RSS" if row["processes"] > 1 else ""
        print(f"    {name:<12} RSS {row['rss_mib']:7.1f} MiB  PSS {row['pss_mib']:7.1f} MiB  ({row['processes']} processes{each})")
    print(f"    (run_local itself, not counted: RSS {sample['runner_rss_mib']:.1f} MiB)")
    return {**sample, "errors": []}


def wait_for_line(ctx: Context, child: Child, text: str, timeout: float) -> float:
    began = time.monotonic()
    while text not in child.log_path.read_text(errors="replace"):
        ctx.processes.check_alive()
        if time.monotonic() - began > timeout:
            raise RuntimeError(f"{child.name} did not print {text!r} within {timeout:.0f}s")
        time.sleep(0.2)
    return time.monotonic() - began


def wait_unfinished_runs(ctx: Context, database: Path, runner: Child) -> None:
    deadline = time.monotonic() + ctx.args.timeout
    while True:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=30) as db:
            open_runs = db.execute("SELECT count(*) FROM orchestrator_dagrun WHERE state IN ('queued', 'running')").fetchone()[0]
        if not open_runs:
            return
        ctx.processes.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"the idle stack still has {open_runs} unfinished runs after {ctx.args.timeout:.0f}s")
        time.sleep(1.0)


def stack_rss(runner_pid: int) -> dict[str, Any]:
    """RSS and PSS of each process tree that run_local started, named by its role."""
    trees: dict[str, dict[str, Any]] = {}
    pids: dict[int, str] = {}
    counts: dict[str, int] = {}
    for pid in procfs.children(runner_pid):
        command = procfs.cmdline(pid)
        role = next((name for marker, name in ROLES if marker in command), "other")
        counts[role] = counts.get(role, 0) + 1
        name = f"{role}-{counts[role]}" if role == "worker" else role
        tree = [pid, *procfs.subtree(pid)]
        pids.update({p: procfs.cmdline(p) for p in tree})
        rss = {p: procfs.rss_kib(p) for p in tree}
        trees[name] = {
            "rss_mib": round(sum(rss.values()) / 1024, 1),
            "pss_mib": round(sum(procfs.pss_kib(p) for p in tree) / 1024, 1),
            "processes": len(tree),
            "rss_mib_each": [round(rss[p] / 1024, 1) for p in tree],  # the tree's root first
        }
    return {
        "total_mib": round(sum(t["rss_mib"] for t in trees.values()), 1),
        "total_pss_mib": round(sum(t["pss_mib"] for t in trees.values()), 1),
        "worker_max_mib": max((t["rss_mib"] for n, t in trees.items() if n.startswith("worker")), default=0.0),
        "runner_rss_mib": round(procfs.rss_kib(runner_pid) / 1024, 1),
        "trees": trees,
        "pids": pids,
        "at": datetime.now().isoformat(timespec="seconds"),
    }


def kill_leftovers(members: dict[int, str]) -> None:
    """Anything of the idle stack still alive after run_local stopped (it should not be)."""
    import signal

    for pid, command in members.items():
        if command and procfs.cmdline(pid) == command:
            print(f"  killing a leftover process of the idle stack: {pid} {command[:80]}")
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
