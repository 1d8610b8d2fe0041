"""Benchmark: time waits checked in bursts against checks spread over their poke_interval.

    .venv/bin/python -m bench.wait_spread --runs 50 bunched spread

A throwaway PostgreSQL database and a claimed Redis database (removed at the end). `--runs` runs of
100 tasks `wait_for: {time: <a year ahead>}` (poke_interval 60), made waiting and checked once by
the scheduler's own passes; then, per mode, the scheduler's loop (a pass, a 1 s sleep) for one
interval to settle and one more measured: the checks made (the waits' `checks` counters), this
process's CPU plus its PostgreSQL backend's per second of wall time, and the pass times.

- bunched: every wait due at one instant and checked again a poke_interval after its check (the
  rule before the phases: a pass checks 500 at most, so they come due again in bursts of 500);
- spread: the rule of `retries.policy.next_check` with the wait's phase (`check_phase`).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import procfs
from bench.stack import child_env, handle_stop_signals, setup_django
from bench.throwaway import claimed_redis, throwaway_postgres
from bench.waits import backend_pid, make_waiting, settle_checks, waits_dag


def loop(seconds: float) -> list[float]:
    from orchestrator.engine import scheduler

    passes: list[float] = []
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        start = time.perf_counter()
        scheduler.schedule_once()
        passes.append(time.perf_counter() - start)
        time.sleep(1.0)
    return passes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("modes", nargs="+", choices=("bunched", "spread"))
    args = parser.parse_args()
    handle_stop_signals()
    with ExitStack() as stack:
        database_url = stack.enter_context(throwaway_postgres("postgres://postgres@127.0.0.1:5432/postgres", "wait_spread"))
        redis_url = stack.enter_context(claimed_redis("redis://127.0.0.1:6379"))
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="wait-spread-")))
        setup_django(child_env(database_url, redis_url, ORCHESTRATOR_SPOOL_DIR=str(workdir / "spool")))
        from django.core.management import call_command
        from django.db.models import Sum
        from django.utils import timezone

        call_command("migrate", verbosity=0)
        from orchestrator.engine import waits
        from orchestrator.models import TaskWait

        total = args.runs * 100
        far = (timezone.now() + timedelta(days=365)).replace(microsecond=0).isoformat()
        make_waiting(waits_dag("bench_wait_spread", 100, {"time": far}, args.runs), args.runs, total)
        settle_checks()
        phase = waits.check_phase
        for mode in args.modes:
            waits.check_phase = phase if mode == "spread" else (lambda key: None)  # type: ignore[assignment,return-value]
            if mode == "bunched":
                TaskWait.objects.update(next_check_at=timezone.now())
            loop(62)  # one interval for the mode to take hold
            pid = backend_pid()
            checks0 = TaskWait.objects.aggregate(n=Sum("checks"))["n"]
            cpu0, db0, wall0 = time.process_time(), procfs.cpu_seconds(pid)[0], time.perf_counter()
            passes = sorted(loop(60))
            wall = time.perf_counter() - wall0
            cpu, db = time.process_time() - cpu0, procfs.cpu_seconds(pid)[0] - db0
            checks = TaskWait.objects.aggregate(n=Sum("checks"))["n"] - checks0
            print(
                f"{mode:<8} {total} time waits: {checks} checks in {wall:.1f} s, {len(passes)} passes; "
                f"process {100 * cpu / wall:.2f} % + backend {100 * db / wall:.2f} % of one core "
                f"({1000 * (cpu + db) / max(checks, 1):.2f} ms per check); pass median {1000 * passes[len(passes) // 2]:.1f} ms "
                f"(max {1000 * passes[-1]:.1f}); load {Path('/proc/loadavg').read_text().split()[0]}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
