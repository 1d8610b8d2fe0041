"""Soak: minutes of random DAGs through real schedulers and workers while things break, then the
fault suite's invariant check over everything that ran.

    .venv/bin/python bench/soak.py [--minutes 30] [--workers 2] [--concurrency 4] [--seed N]

It makes a throwaway PostgreSQL database (TEST_POSTGRES_URL, default postgres://postgres@127.0.0.1:5432)
and a private redis-server on a free port (no persistence), and starts one scheduler and
`--workers` workers (concurrency > 1). For `--minutes` it triggers random DAGs (random fan-in,
random application failures with retries, tasks with failpoints armed for them: killed after
"running", killed or exiting before it, a worker killed before the spawn, slow starts; tasks
with hostile outputs: invalid UTF-8, 5 MB, a NUL in the output, an exception or the result),
every 15-40 s kills a random worker with -9 or SIGTERM, the scheduler, or a worker's fork server
with -9, and restarts Redis empty once, half-way.

Run as root (and with `ip` and `nft`), the workers run in a network namespace of their own
(tests/faults/netns.py) and reach PostgreSQL and Redis through forwarders: every 20-60 s the
packets between them and PostgreSQL, Redis or both are dropped (a blackhole, not a refusal) for
5-30 s, and once, at a third of the run, PostgreSQL's for 90 s (a long outage). Elsewhere those
faults are left out, and the summary says so.

Then it lets everything settle, stops every process, and prints the tasks run, the faults
injected and every violation of the invariants (tests/faults/invariants.py): nothing lost or
stuck, never two copies at once, every attempt charged to the right budget. Exit status 0 only
when there is no violation. Not part of the test suite. `--no-nul` leaves out a NUL in an exception's
message or in a result (a NUL in the output is always in).
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
QUEUE = "soak"

# task_id -> the failpoint armed for it (each fires once per task instance: *1)
FAILPOINT_TASKS = {
    "fp_oom": "task.after_running@fp_oom=kill*1",  # SIGKILL after running: resource_exhaustion
    "fp_prekill": "task.before_running@fp_prekill=kill*1",  # killed before running: pre_execution (killed)
    "fp_startup": "task.before_running@fp_startup=exit:3*1",  # exits before running: startup_error (user)
    "fp_worker": "worker.before_spawn@fp_worker=exit:1*1",  # the whole worker dies holding it
    "fp_slow": "task.before_running@fp_slow=sleep:1.5*1",  # a slow start
}
FAILPOINTS = ",".join(FAILPOINT_TASKS.values())
HOSTILE_KINDS = ("invalid_utf8", "huge", "nul_output", "nul_exception", "nul_result")
LONG_OUTAGE_SECONDS = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="soak-redis-")
        self.proc: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        import redis

        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.RedisError:
                time.sleep(0.1)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Processes:
    """The scheduler and workers, restarted when they die; every one killed at the end."""

    def __init__(self, env: dict[str, str], logdir: Path, workers: int, concurrency: int, worker_env: dict[str, str] | None = None, net=None) -> None:
        self.env = env
        self.worker_env = worker_env or {}
        self.net = net  # the workers' network namespace, when there is one
        self.logdir = logdir
        self.concurrency = concurrency
        self.workers: list[subprocess.Popen | None] = [None] * workers
        self.scheduler: subprocess.Popen | None = None
        self.all: list[subprocess.Popen] = []
        self.counter = 0

    def _start(self, *args: str, netns: bool = False, **extra: str) -> subprocess.Popen:
        self.counter += 1
        prefix = ["ip", "netns", "exec", self.net.ns] if netns and self.net is not None else []
        with open(self.logdir / f"{args[0]}-{self.counter}.log", "w") as log:
            proc = subprocess.Popen(
                [*prefix, PY, str(ROOT / "manage.py"), *args], env={**self.env, **extra}, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.all.append(proc)
        return proc

    def ensure(self) -> int:
        """Start whatever is not running; returns how many were (re)started."""
        started = 0
        for i, proc in enumerate(self.workers):
            if proc is None or proc.poll() is not None:
                self.workers[i] = self._start(
                    "run_worker", QUEUE, "--concurrency", str(self.concurrency), netns=True, ORCHESTRATOR_FAILPOINTS=FAILPOINTS, **self.worker_env
                )
                started += 1
        if self.scheduler is None or self.scheduler.poll() is not None:
            self.scheduler = self._start("run_scheduler")
            started += 1
        return started

    def stop_all(self) -> None:
        for proc in self.all:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except OSError:
                    pass
        deadline = time.monotonic() + 15
        for proc in self.all:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait(timeout=10)


def fork_server_of(worker_pid: int) -> int | None:
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == worker_pid and b"forkserver" in Path(f"/proc/{entry.name}/cmdline").read_bytes():
                return int(entry.name)
        except (OSError, ValueError, IndexError):
            continue
    return None


def random_dag(rng: random.Random, records: str, hostile_kinds: tuple[str, ...] = HOSTILE_KINDS):
    """3-10 tasks, each with random upstreams among the earlier ones; some with a failpoint armed,
    some failing their first user tries."""
    from orchestrator.models import Dag, Task

    dag = Dag.objects.create(
        dag_id=f"soak-{uuid.uuid4().hex[:10]}",
        max_active_runs=100,
        default_args={"queue": QUEUE, "retries": 2, "retry_delay": 0.2, "retry_jitter": "none", "execution_timeout": 20, "kill_grace": 1},
    )
    count = rng.randint(3, 10)
    names: list[str] = []
    fp_left = list(FAILPOINT_TASKS)
    rng.shuffle(fp_left)
    for position in range(count):
        if fp_left and rng.random() < 0.3:
            task_id = fp_left.pop()
        else:
            task_id = f"t{position}"
        upstream = rng.sample(names, k=min(len(names), rng.randint(0, 2))) if names else []
        kind = rng.random()
        if kind < 0.06 and hostile_kinds:
            spec = {"python_callable": "tests.faults.tasks.hostile_output", "op_kwargs": {"kind": rng.choice(hostile_kinds), "records": records}}
        elif kind < 0.18:
            spec = {"python_callable": "tests.faults.tasks.recorded", "op_kwargs": {"records": records, "seconds": 0.2, "fail_user_tries": rng.randint(1, 3)}}
        else:
            spec = {"python_callable": "tests.faults.tasks.quick", "op_kwargs": {"records": records, "seconds": round(rng.uniform(0, 1.5), 2)}}
        Task.objects.create(dag=dag, position=position, task_id=task_id, upstream=upstream, **spec)
        names.append(task_id)
    return dag


def partition_or_none():
    """The workers' network namespace, or None where one cannot be made (not root, no tools)."""
    from tests.faults.netns import Partition

    try:
        return Partition().__enter__()
    except BaseException as exc:  # pytest's skip is a BaseException
        print(f"soak: no network namespace ({exc}); blackholes left out", flush=True)
        return None


def main() -> int:  # noqa: C901  a script read top to bottom: the stack, the loop of faults, the checks
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--settle-minutes", type=float, default=4.0, help="how long to wait for the last runs to finish")
    parser.add_argument("--no-nul", action="store_true", help="leave out a NUL in an exception's message or a result")
    parser.add_argument("--no-network", action="store_true", help="no network namespace: no blackholes")
    options = parser.parse_args()
    seed = options.seed if options.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    base = os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432")
    db_name = f"soak_{int(time.time())}_{os.getpid()}"
    import psycopg

    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db_name}"')
    redis_server = Redis()
    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    records = workdir / "records"
    records.mkdir()
    procs: Processes | None = None
    net = None
    try:
        redis_server.start()
        env = dict(os.environ)
        env.update(
            DATABASE_URL=f"{base}/{db_name}",
            REDIS_URL=redis_server.url,
            SECRET_KEY=os.environ.get("SECRET_KEY") or "soak-only",
            DEBUG="0",
            PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            PYTHONUNBUFFERED="1",
            ORCHESTRATOR_SCHEDULER_INTERVAL="0.2",
            ORCHESTRATOR_HEARTBEAT_INTERVAL="0.5",
            ORCHESTRATOR_HEARTBEAT_TIMEOUT="4",
            ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY="0.5",
            ORCHESTRATOR_QUEUED_TIMEOUT="6",
            ORCHESTRATOR_KILL_GRACE="1",
            ORCHESTRATOR_WORKER_SHUTDOWN_GRACE="2",
            # Its own spool: another checkout user's workers must not deliver its reports.
            ORCHESTRATOR_SPOOL_DIR=str(workdir / "spool"),
        )
        subprocess.run([PY, str(ROOT / "manage.py"), "migrate", "-v", "0"], env=env, cwd=ROOT, check=True)
        os.environ.update({k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG")})
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from orchestrator.engine.run_creation import create_manual_run
        from orchestrator.models import DagRun, TaskAttempt, TaskInstance
        from tests.faults.invariants import read_records, violations

        worker_env: dict[str, str] = {}
        if not options.no_network:
            net = partition_or_none()
        if net is not None:
            from urllib.parse import urlsplit

            pg = urlsplit(env["DATABASE_URL"])
            net.pg_port = net.expose(pg.port or 5432, pg.hostname or "127.0.0.1")
            net.redis_port = net.expose(redis_server.port)
            user = f"{pg.username}@" if pg.username else ""
            worker_env = {
                "DATABASE_URL": f"postgres://{user}{net.host_ip}:{net.pg_port}{pg.path}",
                "REDIS_URL": f"redis://{net.host_ip}:{net.redis_port}/0",
            }
        hostile_kinds = tuple(k for k in HOSTILE_KINDS if not (options.no_nul and k in ("nul_exception", "nul_result")))
        procs = Processes(env, workdir, options.workers, options.concurrency, worker_env, net)
        procs.ensure()
        faults: Counter[str] = Counter()
        if net is None:
            faults["(no network namespace: blackholes left out)"] += 0
        next_blackhole = time.monotonic() + rng.uniform(20, 60)
        blackhole_until: float | None = None
        long_outage_at = time.monotonic() + options.minutes * 20
        long_outage_done = False
        runs: list[int] = []
        end = time.monotonic() + options.minutes * 60
        next_kill = time.monotonic() + rng.uniform(15, 40)
        redis_restart_at = time.monotonic() + options.minutes * 30
        redis_restarted = False
        print(f"soak: seed {seed}, {options.minutes:g} min, {options.workers} workers x {options.concurrency}, work in {workdir}", flush=True)
        last_report = time.monotonic()
        while time.monotonic() < end:
            restarted = procs.ensure()
            if restarted:
                faults["process restarted after dying"] += restarted
            active = DagRun.objects.filter(pk__in=runs, state__in=["queued", "running"]).count()
            if active < 12:
                dag = random_dag(rng, str(records), hostile_kinds)
                runs.append(create_manual_run(dag, conf={"soak": True, "note": "<b>é</b>"}).pk)
                faults["failpoint armed"] += sum(1 for t in dag.tasks.all() if t.task_id in FAILPOINT_TASKS)
                faults["hostile output"] += sum(1 for t in dag.tasks.all() if t.python_callable == "tests.faults.tasks.hostile_output")
            now = time.monotonic()
            if now >= next_kill:
                live = [p for p in procs.workers if p is not None and p.poll() is None]
                roll = rng.random()
                if roll < 0.15 and procs.scheduler is not None and procs.scheduler.poll() is None:
                    os.kill(procs.scheduler.pid, signal.SIGKILL)
                    faults["scheduler kill -9"] += 1
                elif roll < 0.4 and live:
                    server = fork_server_of(rng.choice(live).pid)
                    if server is not None:
                        os.kill(server, signal.SIGKILL)
                        faults["fork server kill -9"] += 1
                elif live:
                    victim = rng.choice(live)
                    if roll < 0.7:
                        os.kill(victim.pid, signal.SIGKILL)
                        faults["worker kill -9"] += 1
                    else:
                        os.kill(victim.pid, signal.SIGTERM)
                        faults["worker SIGTERM"] += 1
                next_kill = now + rng.uniform(15, 40)
            if net is not None:
                if blackhole_until is not None and now >= blackhole_until:
                    net.heal()
                    blackhole_until = None
                    next_blackhole = now + rng.uniform(20, 60)
                elif blackhole_until is None and not long_outage_done and now >= long_outage_at:
                    net.drop(net.pg_port)
                    blackhole_until = now + LONG_OUTAGE_SECONDS
                    long_outage_done = True
                    faults[f"PostgreSQL blackholed {LONG_OUTAGE_SECONDS} s"] += 1
                elif blackhole_until is None and now >= next_blackhole:
                    target = rng.choice(["postgres", "redis", "both", "postgres answers only"])
                    if target in ("postgres", "both"):
                        net.drop(net.pg_port)
                    if target in ("redis", "both"):
                        net.drop(net.redis_port)
                    if target == "postgres answers only":
                        net.drop(net.pg_port, "in")
                    blackhole_until = now + rng.uniform(5, 30)
                    faults[f"blackhole: {target}"] += 1
            if not redis_restarted and now >= redis_restart_at:
                redis_server.stop()
                redis_server.start()
                from orchestrator.foundation import redis_conn

                redis_conn._clients.clear()
                faults["redis restarted empty"] += 1
                redis_restarted = True
            if now - last_report > 30:
                done = DagRun.objects.filter(pk__in=runs, state__in=["success", "failed"]).count()
                print(f"  {len(runs)} runs triggered, {done} finished, {TaskAttempt.objects.count()} attempts", flush=True)
                last_report = now
            time.sleep(0.5)

        if net is not None:
            net.heal()
        print("soak: no new runs; waiting for the runs to settle", flush=True)
        settle_end = time.monotonic() + options.settle_minutes * 60
        settled_states = {"success", "failed", "upstream_failed", "skipped", "removed", "dead_letter"}
        while time.monotonic() < settle_end:
            procs.ensure()
            states = set(TaskInstance.objects.filter(dag_run_id__in=runs).values_list("state", flat=True))
            unfinished_runs = DagRun.objects.filter(pk__in=runs, state__in=["queued", "running"]).exclude(task_instances__state="dead_letter").count()
            if states <= settled_states and unfinished_runs == 0:
                break
            time.sleep(1)
        procs.stop_all()

        run_objects = list(DagRun.objects.filter(pk__in=runs))
        found = violations(run_objects, [records])
        attempts = TaskAttempt.objects.filter(task_instance__dag_run_id__in=runs)
        starts = sum(1 for r in read_records([records]) if r["event"] == "start")
        tis = TaskInstance.objects.filter(dag_run_id__in=runs)
        by_reason = Counter(
            (a.kind, (a.context or {}).get("reason") or a.state) for a in attempts.only("kind", "context", "state")
        )
        print()
        print(f"soak: seed {seed}, {options.minutes:g} minutes, {options.workers} workers, concurrency {options.concurrency}")
        print(f"runs: {len(run_objects)} ({Counter(r.state for r in run_objects)})")
        print(f"tasks run: {tis.count()} task instances, {attempts.count()} attempts, {starts} task starts recorded")
        print(f"task states: {dict(Counter(tis.values_list('state', flat=True)))}")
        print(f"faults injected: {sum(faults.values())} ({dict(faults)})")
        print("attempts by budget and reason: " + ", ".join(f"{k}/{r}: {n}" for (k, r), n in sorted(by_reason.items())))
        stuck = TaskInstance.objects.filter(dag_run_id__in=runs, state="queued")
        if stuck:
            from orchestrator.foundation.redis_conn import get_redis, job_statuses

            r = get_redis()
            for ti, status in zip(stuck, job_statuses([ti.job_id for ti in stuck])):
                places = [key.decode() for key in r.keys("rq:queue:*") if r.lpos(key, ti.job_id) is not None]
                print(f"stuck queued: {ti.task_id} job {ti.job_id} rq status {status!r} in {places or 'no queue list'}; claimed by {ti.worker_name or 'nobody'}")
        print(f"violations: {len(found)}")
        for problem in found[:200]:
            print(f"  {problem}")
        return 1 if found else 0
    finally:
        if procs is not None:
            procs.stop_all()
        if net is not None:
            net.__exit__(None, None, None)
        redis_server.close()
        try:
            from django.db import connections

            connections.close_all()
        except Exception:
            pass
        with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
        if os.environ.get("SOAK_KEEP") != "1":
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
