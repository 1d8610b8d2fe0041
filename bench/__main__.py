"""python -m bench: the engine's workloads against their targets, with the floors of the same run.

    .venv/bin/python -m bench                      # everything (3 to 5 minutes on 2 cores)
    .venv/bin/python -m bench --only fanout,chain  # some workloads (the floors always run)
    .venv/bin/python -m bench --json out.json --profile profiles/

It creates a throwaway PostgreSQL database on DATABASE_URL's server (default
postgres://postgres@127.0.0.1:5432/postgres) and claims an empty Redis database 1-15 on
REDIS_URL's server (default redis://127.0.0.1:6379), migrates, and starts real `manage.py
run_scheduler` and `manage.py run_worker` processes; the database is dropped, the Redis
database flushed and every process stopped at the end, also after an error or Ctrl-C.

Workloads (in this order):
  fanout       --fanout-tasks independent python no-op tasks in one run, --workers workers; the
               median of --fanout-repeats runs
  fanout-bash  the same with bash `true` tasks
  wide         (not in the default set) a root, --wide-tasks python no-op tasks, a sink: tasks/s
               against the fan-out of the same run (run it with fanout: --only fanout,wide)
  trigger-wide (not in the default set) the trigger of a run of --wide-tasks independent tasks, to
               its first task running; the run is then abandoned (queue emptied, run failed)
  chain        --chain-length python no-op tasks in sequence: end of one -> start of the next
  chain-seen   the same chain as the tasks see it: each task writes when its code starts and ends
  width        --width-tasks python tasks sleeping --width-sleep s, workers at --width-concurrency;
               the summed PSS of workers, fork servers and task processes at the peak
  queries      (no target) the queries and time of each step of one attempt, in-process
  scheduler    schedule_once() in-process over --sched-runs x --sched-tasks active task instances
  three-step   (not in the default set) three sequential python no-op steps triggered through the
               HTTP API, on SQLite as `make run` starts it and on PostgreSQL with --workers workers and
               gunicorn: median/p95 end to end of --three-step-flows flows one at a time, flows/s of
               --three-step-burst started at once, per step; beside plain RQ's three chained jobs
  api-profile  (not in the default set) one POST of a three-task run and one GET of its document on
               the idle PostgreSQL stack behind gunicorn: the client's time, Django's, SQL's; cProfile;
               then the same with a new database connection per request (conn_max_age=0)
  preload      (not in the default set) a chain whose task module imports heavy libraries, with and
               without ORCHESTRATOR_PRELOAD_MODULES naming it: per step end to end
  idle-stack   `manage.py run_local` (what `make run` starts: SQLite, the bundled Redis) at rest:
               summed RSS of web, scheduler, workers (each with its fork server) and Redis
Floors (always): `python -c pass`, a fork of a warm Django process, and plain `rq worker`
processes draining --raw-jobs jobs that each run `python -c pass`; with three-step, plain RQ's
three chained jobs of `python -c pass` (depends_on), one at a time and --three-step-burst at once.

Every workload prints its figures, its target and PASS or MISS; a table and a JSON file
(--json) sum them up. The exit status is 1 when a target is missed or a workload failed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import floors, three_step, workloads
from bench import stack as bench_stack
from bench.stack import ROOT, Processes, child_env, handle_stop_signals, setup_django
from bench.throwaway import claimed_redis, throwaway_postgres

ORIGINAL_ENV = dict(os.environ)
ORDER = ("fanout", "fanout-bash", "chain", "chain-seen", "width", "queries", "scheduler", "idle-stack")
OPTIONAL = ("wide", "trigger-wide", "three-step", "api-profile", "preload")  # run only when named in --only
TITLES = {
    "wide": "wide run", "trigger-wide": "trigger, wide run", "chain-seen": "chain, as tasks see it",
    "fanout": "fan-out, python", "fanout-bash": "fan-out, bash", "chain": "chain", "width": "width",
    "queries": "queries per attempt", "scheduler": "scheduler pass", "idle-stack": "idle stack",
    "three-step": "three-step flows", "api-profile": "API, idle stack", "preload": "chain, heavy module",
}
DEFAULTS = {"workers": 2, "fanout_tasks": 300, "fanout_repeats": 3, "chain_length": 30, "width_tasks": 1000, "width_concurrency": 500,
            "width_sleep": 5.0, "sched_runs": 200, "sched_tasks": 50, "raw_jobs": 300}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--only", default=",".join(ORDER), help=f"comma-separated workloads (default all: {','.join(ORDER)})")
    parser.add_argument("--json", type=Path, default=Path("bench-results.json"), help="where to write the results (default bench-results.json)")
    parser.add_argument("--workers", type=int, default=DEFAULTS["workers"], help="run_worker processes (default 2)")
    parser.add_argument("--concurrency", type=int, default=None, help="run_worker --concurrency for fanout and chain (default: the project's)")
    parser.add_argument("--fanout-tasks", type=int, default=DEFAULTS["fanout_tasks"], help="tasks of a fan-out run (default 300)")
    parser.add_argument("--fanout-repeats", type=int, default=DEFAULTS["fanout_repeats"],
                        help="fan-out runs of each kind; the median counts (default 3)")
    parser.add_argument("--wide-tasks", type=int, default=10_000, help="middle tasks of the wide run, tasks of trigger-wide's (default 10000)")
    parser.add_argument("--chain-length", type=int, default=DEFAULTS["chain_length"], help="tasks of the chain (default 30)")
    parser.add_argument("--width-tasks", type=int, default=DEFAULTS["width_tasks"], help="sleeping tasks of the width run (default 1000)")
    parser.add_argument("--width-concurrency", type=int, default=DEFAULTS["width_concurrency"], help="run_worker --concurrency for width (default 500)")
    parser.add_argument("--width-sleep", type=float, default=DEFAULTS["width_sleep"], help="seconds each width task sleeps (default 5)")
    parser.add_argument("--sched-runs", type=int, default=DEFAULTS["sched_runs"], help="running runs for the scheduler pass (default 200)")
    parser.add_argument("--sched-tasks", type=int, default=DEFAULTS["sched_tasks"], help="active task instances per run (default 50)")
    parser.add_argument("--sched-repeats", type=int, default=5, help="timed scheduler passes; the median counts (default 5)")
    parser.add_argument("--query-samples", type=int, default=20, help="attempts sampled by the queries workload (default 20)")
    parser.add_argument("--floor-runs", type=int, default=20, help="runs of `python -c pass` (default 20)")
    parser.add_argument("--forks", type=int, default=200, help="forks of the warm process (default 200)")
    parser.add_argument("--raw-jobs", type=int, default=DEFAULTS["raw_jobs"], help="jobs for plain RQ (default 300)")
    parser.add_argument("--raw-worker-class", choices=sorted(floors.WORKER_CLASSES), default="simple",
                        help="plain RQ's worker: simple (rq.worker.SimpleWorker, the job runs in the worker; default) "
                             "or default (rq.worker.Worker, a forked work horse per job)")
    parser.add_argument("--three-step-flows", type=int, default=100, help="three-step flows run one at a time (default 100)")
    parser.add_argument("--three-step-burst", type=int, default=200, help="three-step flows started at once (default 200)")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds the idle stack rests before it is measured (default 10)")
    parser.add_argument("--preload", default="bench.tasks",
                        help="ORCHESTRATOR_PRELOAD_MODULES of the engine's workers (default bench.tasks; '' for none, as a deployment "
                             "that preloads nothing: each task process then imports its module)")
    parser.add_argument("--interval", type=float, default=None, help="ORCHESTRATOR_SCHEDULER_INTERVAL (default: the project's)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for one run (default 600)")
    parser.add_argument("--memory-limit", type=int, default=None, metavar="MIB",
                        help="every task of every workload with this memory_limit (default none): what the limits cost")
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy the processes' logs to this directory")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy profiles of the processes during each run, into this directory")
    args = parser.parse_args(argv)
    args.only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(args.only) - set(ORDER) - set(OPTIONAL))
    if unknown:
        parser.error(f"unknown workloads {', '.join(unknown)}: choose among {', '.join(ORDER)}")
    if min(args.workers, args.fanout_tasks, args.fanout_repeats, args.chain_length, args.width_tasks, args.sched_runs, args.sched_tasks, args.raw_jobs) < 1:
        parser.error("the sizes must be at least 1")
    return args


# --- targets -------------------------------------------------------------------------------------------


def _get(data: dict[str, Any], path: str) -> float | None:
    for key in path.split("."):
        if not isinstance(data, dict) or data.get(key) is None:
            return None
        data = data[key]
    return float(data)


# workload -> (what, where in its figures, comparison, threshold, unit)
TARGETS: dict[str, list[tuple[str, str, str, float, str]]] = {
    "fanout": [("throughput", "tasks_per_s", ">=", 120, "tasks/s"), ("vs raw RQ + subprocess", "vs_raw", ">=", 1.0, "x")],
    "fanout-bash": [("throughput", "tasks_per_s", ">=", 150, "tasks/s")],
    "chain": [("median end -> next start", "gap_median_ms", "<=", 20, "ms")],
    "chain-seen": [("median code end -> next code start", "gap_median_ms", "<=", 12, "ms")],
    "trigger-wide": [("trigger -> first task running", "first_running_s", "<=", 2, "s")],
    "wide": [("throughput", "tasks_per_s", "", 0, "tasks/s"), ("vs the fan-out of the same run", "vs_fanout", ">=", 0.9, "x")],
    "width": [("all done (trigger -> run end)", "wall_s", "<=", 15, "s"), ("peak PSS, workers + tasks", "pss.peak_pss_mib", "<=", 2048, "MiB")],
    "scheduler": [("schedule_once()", "pass_ms", "<=", 100, "ms")],
    "idle-stack": [("summed RSS", "total_mib", "<=", 300, "MiB"), ("largest idle worker + fork server", "worker_max_mib", "<=", 100, "MiB")],
    "queries": [("per attempt, 1-task run", "by_run_width.1.per_attempt.queries", "", 0, "queries")],
    "three-step": [
        ("SQLite: median end to end", "sqlite.to_end_date.median_ms", "", 0, "ms"),
        ("SQLite: p95 end to end", "sqlite.to_end_date.p95_ms", "", 0, "ms"),
        ("SQLite: per step", "sqlite.to_end_date.per_step_ms", "", 0, "ms"),
        ("SQLite: flows/s, 200 at once", "sqlite.at_once.flows_per_s", "", 0, "flows/s"),
        ("PostgreSQL: median end to end", "postgresql.to_end_date.median_ms", "", 0, "ms"),
        ("PostgreSQL: p95 end to end", "postgresql.to_end_date.p95_ms", "", 0, "ms"),
        ("PostgreSQL: per step", "postgresql.to_end_date.per_step_ms", "", 0, "ms"),
        ("PostgreSQL: flows/s, 200 at once", "postgresql.at_once.flows_per_s", ">=", 50, "flows/s"),
        ("PostgreSQL: 200 POSTs answered", "postgresql.at_once.posts_done_s", "<=", 1, "s"),
    ],
    "api-profile": [
        ("POST runs, in Django", "as_compose.POST runs.server_app", "<=", 5, "ms"),
        ("GET run, in Django", "as_compose.GET run.server_app", "<=", 5, "ms"),
        ("POST runs, in Django, conn. per request", "connection_per_request.POST runs.server_app", "", 0, "ms"),
        ("GET run, in Django, conn. per request", "connection_per_request.GET run.server_app", "", 0, "ms"),
    ],
    "preload": [
        ("per step, module not preloaded", "per_step_without_ms", "", 0, "ms"),
        ("per step, module preloaded", "per_step_with_ms", "", 0, "ms"),
    ],
}


def checks(name: str, figures: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    errors = figures.get("errors") or []
    for what, path, op, threshold, unit in TARGETS[name]:
        value = _get(figures, path)
        if not op:
            passed, target = None, "-"
        else:
            met = value is not None and (value >= threshold if op == ">=" else value <= threshold)
            passed, target = bool(met) and not errors, f"{op} {threshold:g} {unit}"
        rows.append({"workload": name, "measure": what, "value": value, "unit": unit, "target": target, "passed": passed,
                     "errors": errors})
    return rows


def verdict(passed: bool | None) -> str:
    return "-" if passed is None else "PASS" if passed else "MISS"


def print_check(row: dict[str, Any]) -> None:
    value = "error" if row["value"] is None else f"{row['value']:.1f} {row['unit']}" if row["unit"] != "x" else f"{row['value']:.2f}x"
    note = f"  ({'; '.join(row['errors'])})" if row["errors"] else ""
    print(f"  {TITLES[row['workload']]:<22} {row['measure']:<36} {value:>16}   {row['target']:<16} {verdict(row['passed'])}{note}")


# --- the run -------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model, memory = "", 0
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "")
        with open("/proc/meminfo") as meminfo:
            memory = next((int(line.split()[1]) for line in meminfo if line.startswith("MemTotal")), 0)
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "memory_gib": round(memory / 2**20, 1), "kernel": platform.release(),
            "python": platform.python_version()}


def source() -> dict[str, Any]:
    """The commit measured, and the files that differ from it (other than the benchmark's own)."""
    import subprocess

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    changed = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()]
    return {"commit": git("rev-parse", "HEAD").strip() or "unknown",
            "changed_files": [path for path in changed if not path.startswith(("bench/", "docs/"))]}


def server_versions(redis_url: str) -> dict[str, str]:
    from django.db import connection

    from orchestrator.foundation.redis_conn import get_redis

    pg = connection.pg_version
    return {"postgresql": f"{pg // 10000}.{pg % 10000}", "redis": get_redis().info("server")["redis_version"], "redis_url": redis_url}


def run_floors(args: argparse.Namespace, processes: Processes, env: dict[str, str], redis_url: str) -> dict[str, Any]:
    print("\n== floors")
    result = {"python_c_pass": floors.python_startup(args.floor_runs, env)}
    print(f"  python -c pass: {result['python_c_pass']['mean_ms']:.1f} ms mean over {args.floor_runs} runs")
    result["warm_fork"] = floors.warm_fork(args.forks, env)
    print(f"  fork + _exit + waitpid of a warm Django process ({result['warm_fork']['parent_rss_mib']} MiB RSS): "
          f"{result['warm_fork']['mean_ms']:.2f} ms mean over {args.forks} forks")
    result["raw_rq"] = floors.raw_rq(args.raw_jobs, args.workers, args.raw_worker_class, processes, redis_url, args.timeout)
    raw = result["raw_rq"]
    print(f"  plain RQ, {raw['workers']} x {raw['worker_class']}: {raw['jobs']} jobs of `python -c pass` in {raw['wall_s']:.2f} s, "
          f"{raw['jobs_per_s']:.1f} jobs/s (median job {raw['job_busy_median_ms']:.1f} ms), {raw['failed']} failed")
    if "three-step" in args.only:
        result["raw_rq_chained"] = floors.raw_rq_chained(args.three_step_flows, args.three_step_burst, args.workers, args.raw_worker_class,
                                                         processes, redis_url, args.timeout)
        chained = result["raw_rq_chained"]
        print(f"  plain RQ, three chained jobs of `python -c pass`: median {chained['median_ms']:.1f} ms, p95 {chained['p95_ms']:.1f} ms "
              f"over {chained['n']} flows one at a time; {chained['flows_per_s']:.1f} flows/s for {chained['burst']} at once")
    return result


def run_workload(name: str, ctx: workloads.Context, report: dict[str, Any]) -> None:
    print(f"\n######## {TITLES[name]}")
    began = time.monotonic()
    try:
        figures = {
            "fanout": lambda: workloads.fanout(ctx, "python"),
            "fanout-bash": lambda: workloads.fanout(ctx, "bash"),
            "chain": lambda: workloads.chain(ctx),
            "chain-seen": lambda: workloads.chain_seen(ctx),
            "trigger-wide": lambda: workloads.trigger_wide(ctx),
            "wide": lambda: workloads.wide(ctx),
            "width": lambda: workloads.width(ctx),
            "queries": lambda: workloads.attempt_queries(ctx),
            "scheduler": lambda: workloads.scheduler_pass(ctx),
            "idle-stack": lambda: workloads.idle_stack(ctx),
            "three-step": lambda: three_step.three_step(ctx, report["floors"].get("raw_rq_chained")),
            "api-profile": lambda: three_step.api_profile_both(ctx),
            "preload": lambda: three_step.preload_chain(ctx),
        }[name]()
    except Exception as exc:
        traceback.print_exc()
        figures = {"errors": [f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"]}
    if name == "wide" and figures.get("tasks_per_s") is not None:
        fanout = report["workloads"].get("fanout", {}).get("tasks_per_s")
        figures["vs_fanout"] = figures["tasks_per_s"] / fanout if fanout else None
    if name == "fanout" and figures.get("tasks_per_s") is not None:
        raw = report["floors"].get("raw_rq", {}).get("jobs_per_s")
        figures["vs_raw"] = figures["tasks_per_s"] / raw if raw else None
    figures["seconds"] = round(time.monotonic() - began, 1)
    report["workloads"][name] = figures
    rows = checks(name, figures)
    report["checks"].extend(rows)
    print()
    for row in rows:
        print_check(row)


def print_summary(report: dict[str, Any]) -> None:
    print("\n######## summary")
    m = report["machine"]
    print(f"  machine: {m['cpus']} CPUs ({m.get('cpu_model', '')}), {m.get('memory_gib')} GiB; PostgreSQL {m.get('postgresql', '?')}, "
          f"Redis {m.get('redis', '?')}; load average before {report['load_before']}, after {report.get('load_after')}")
    fl = report["floors"]
    if fl:
        parts = []
        if "python_c_pass" in fl:
            parts.append(f"python -c pass {fl['python_c_pass']['mean_ms']:.1f} ms")
        if "warm_fork" in fl:
            parts.append(f"warm fork {fl['warm_fork']['mean_ms']:.2f} ms")
        if "raw_rq" in fl:
            parts.append(f"raw RQ + subprocess {fl['raw_rq']['jobs_per_s']:.1f} jobs/s ({fl['raw_rq']['workers']} x {fl['raw_rq']['worker_class']})")
        if "raw_rq_chained" in fl:
            ch = fl["raw_rq_chained"]
            parts.append(f"raw RQ, 3 jobs chained: median {ch['median_ms']:.1f} ms, p95 {ch['p95_ms']:.1f} ms, {ch['flows_per_s']:.1f} flows/s")
        print("  floors: " + "; ".join(parts))
    print(f"\n  {'workload':<22} {'measure':<36} {'figure':>16}   {'target':<16} result")
    for row in report["checks"]:
        print_check(row)
    if report.get("error"):
        print(f"\n  the benchmark stopped early: {report['error']}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    handle_stop_signals()
    default_sizes = all(getattr(args, key) == value for key, value in DEFAULTS.items())
    report: dict[str, Any] = {
        "command": "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "source": source(),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "sizes": {key: getattr(args, key) for key in DEFAULTS} | {"concurrency": args.concurrency, "interval": args.interval,
                                                                   "memory_limit": args.memory_limit, "preload": args.preload},
        "default_sizes": default_sizes,
        "floors": {},
        "workloads": {},
        "checks": [],
    }
    if not default_sizes:
        print("note: the sizes differ from the ones the targets are set for")
    if args.memory_limit:
        bench_stack.DAG_DEFAULT_ARGS["memory_limit"] = args.memory_limit
        print(f"note: every task runs with memory_limit {args.memory_limit} MiB")
    try:
        with ExitStack() as stack:
            workdir = Path(tempfile.mkdtemp(prefix="bench-"))
            stack.callback(shutil.rmtree, workdir, ignore_errors=True)
            log_dir = workdir / "logs"
            log_dir.mkdir()
            server_url = ORIGINAL_ENV.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
            database_url = stack.enter_context(throwaway_postgres(server_url, "bench"))
            redis_url = stack.enter_context(claimed_redis(ORIGINAL_ENV.get("REDIS_URL") or "redis://127.0.0.1:6379"))
            # The task module is preloaded by the fork servers (unless --preload says otherwise), as a
            # deployment would preload its own; outcomes a worker could not report go to a spool of
            # this run's own.
            env = child_env(database_url, redis_url, args.interval, ORCHESTRATOR_PRELOAD_MODULES=args.preload,
                            ORCHESTRATOR_SPOOL_DIR=str(workdir / "spool"))
            setup_django(env)
            from django.core.management import call_command

            call_command("migrate", verbosity=0)
            report["machine"].update(server_versions(redis_url))
            processes = Processes(env, log_dir)
            if args.keep_logs:  # runs after the processes stopped (callbacks run last-in, first-out)
                stack.callback(shutil.copytree, log_dir, args.keep_logs, dirs_exist_ok=True)
            stack.callback(processes.stop)
            print(f"{report['machine']['cpus']} CPUs, load average {report['load_before']}; PostgreSQL "
                  f"{report['machine']['postgresql']}, Redis {report['machine']['redis']} at {redis_url}")
            report["floors"] = run_floors(args, processes, env, redis_url)
            ctx = workloads.Context(args=args, processes=processes, workdir=workdir, original_env=ORIGINAL_ENV,
                                    profile_dir=args.profile.resolve() if args.profile else None)
            for name in (*ORDER[:1], *OPTIONAL, *ORDER[1:]):
                if name in args.only:
                    run_workload(name, ctx, report)
            workloads.stop_stack(ctx)
            if args.memory_limit:
                from orchestrator.models import TaskAttempt

                limited = TaskAttempt.objects.filter(memory_limit_mib=args.memory_limit).count()
                print(f"\n  attempts run with memory_limit {args.memory_limit} MiB: {limited} of {TaskAttempt.objects.count()}")
            alarms, notable = processes.scan_logs()
            report["log_alarms"] = {k: v[:20] for k, v in alarms.items()}
            report["log_errors"] = notable[:50]
            if notable:
                print(f"\n  error lines in the processes' logs: {len(notable)}")
                for line in notable[:10]:
                    print(f"    {line}")
    except KeyboardInterrupt:
        report["error"] = "interrupted"
    except Exception as exc:
        traceback.print_exc()
        report["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        report["load_after"] = [round(x, 2) for x in os.getloadavg()]
        report["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        print_summary(report)
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"\nresults written to {args.json}")
    missed = [row for row in report["checks"] if row["passed"] is False]
    return 1 if missed or report.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
