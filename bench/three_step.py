"""The public three-step benchmark (the shape Windmill published): a flow of three sequential
trivial python steps, triggered through the HTTP API as a user's client does
(`POST /api/v1/dags/DAG_ID/runs` with a bearer token).

  * one at a time: `--flows` flows, each triggered once the one before ended; end to end is the
    client's clock before it sent the POST -> the run's `end_date` (the same machine's clock).
    Beside it, the moment the client saw the run ended, polling the run's document every
    POLL_S s through the API (what a client that waits pays on top);
  * at once: `--burst` flows triggered from CLIENT_THREADS client threads; flows/s is their
    number / (the last run's `end_date` - the first POST sent). The POSTs' own time is shown;
  * per step: the median end to end / 3 (a step does nothing: all of it is the engine's).

Two stacks: SQLite with the embedded Redis, as `make run` starts it (`manage.py run_local`: its
runserver, scheduler and two workers), and PostgreSQL with `--workers` workers, a scheduler and
gunicorn as the compose file runs it (3 workers), whose answers carry their server time
(bench/servertiming.py). `api_profile` times one POST and one GET on the idle PostgreSQL stack.
"""
from __future__ import annotations

import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import flowstats, servertiming
from bench.stack import MANAGE, ROOT, Child

DAG_ID = "bench_three_step"
STEPS = {"step_1": [], "step_2": ["step_1"], "step_3": ["step_2"]}
CLIENT_THREADS = 16
POLL_S = 0.01
FINISHED = ("success", "failed")
# As run_local gives its runserver: plain HTTP, no redirect to HTTPS.
PLAIN_HTTP = {"SECURE_SSL_REDIRECT": "0", "SESSION_COOKIE_SECURE": "0", "CSRF_COOKIE_SECURE": "0", "SECURE_PROXY_SSL_HEADER": ""}


def three_step_spec(dag_id: str = DAG_ID, callable_: str = "bench.tasks.noop") -> dict[str, Any]:
    """The DAG file of the flow (for a stack that imports its DAGs from a folder)."""
    return {"dag_id": dag_id, "schedule": None, "max_active_runs": 1000,
            "tasks": [{"task_id": task_id, "python_callable": callable_, "upstream": upstream} for task_id, upstream in STEPS.items()]}


def utc_seconds(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


@dataclass
class Api:
    """A client of the HTTP API: a new connection per request, as a script's client makes them."""

    port: int
    token: str
    host: str = "127.0.0.1"

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any, dict[str, float], float]:
        """(status, the JSON answer, the Server-Timing figures if any, the client's milliseconds)."""
        began = time.perf_counter()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            headers = {"Authorization": f"Bearer {self.token}", "Host": f"{self.host}:{self.port}", "Connection": "close"}
            payload = None
            if body is not None:
                payload = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            raw = response.read()
            timing = servertiming.parse(response.getheader("Server-Timing"))
        finally:
            conn.close()
        elapsed = (time.perf_counter() - began) * 1000
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = raw[:200]
        return response.status, data, timing, elapsed

    def trigger(self, dag_id: str) -> tuple[str, dict[str, float], float]:
        status, data, timing, elapsed = self.request("POST", f"/api/v1/dags/{dag_id}/runs", {})
        if status != 201:
            raise RuntimeError(f"POST runs answered {status}: {data}")
        return data["run_id"], timing, elapsed

    def run(self, dag_id: str, run_id: str) -> tuple[dict[str, Any], dict[str, float], float]:
        from urllib.parse import quote

        status, data, timing, elapsed = self.request("GET", f"/api/v1/dags/{dag_id}/runs/{quote(run_id, safe='')}")
        if status != 200:
            raise RuntimeError(f"GET run answered {status}: {data}")
        return data, timing, elapsed

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        status, data, _, _ = self.request("GET", f"/api/v1/dags/{dag_id}/runs?limit=1000")
        if status != 200:
            raise RuntimeError(f"GET runs answered {status}: {data}")
        return data["runs"]

    def healthz(self) -> float:
        began = time.perf_counter()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request("GET", "/healthz", headers={"Host": f"{self.host}:{self.port}", "Connection": "close"})
            conn.getresponse().read()
        finally:
            conn.close()
        return (time.perf_counter() - began) * 1000


def wait_http(port: int, check_alive: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            Api(port, "").healthz()
            return
        except OSError:
            check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing answered on port {port} within {timeout:.0f}s") from None
            time.sleep(0.2)


def one_at_a_time(api: Api, dag_id: str, flows: int, timeout: float) -> dict[str, Any]:
    """`flows` flows, each triggered when the one before was seen ended."""
    to_end, seen, posts = [], [], []
    for _ in range(flows + 1):  # the first warms the web server's and workers' paths; not counted
        sent = time.time()
        run_id, _, post_ms = api.trigger(dag_id)
        deadline = time.monotonic() + timeout
        while True:
            doc, _, _ = api.run(dag_id, run_id)
            if doc["state"] in FINISHED:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {run_id} not finished after {timeout:.0f}s")
            time.sleep(POLL_S)
        seen_at = time.time()
        if doc["state"] != "success":
            raise RuntimeError(f"run {run_id} ended {doc['state']}")
        to_end.append(utc_seconds(doc["end_date"]) - sent)
        seen.append(seen_at - sent)
        posts.append(post_ms)
    to_end, seen, posts = to_end[1:], seen[1:], posts[1:]
    return {"to_end_date": flowstats.end_to_end(to_end), "seen_by_client": flowstats.end_to_end(seen),
            "post_median_ms": round(statistics.median(posts), 2)}


def at_once(api: Api, dag_id: str, count: int, timeout: float) -> dict[str, Any]:
    """`count` flows triggered at once from CLIENT_THREADS threads; flows/s to the last run's end."""
    first_sent = time.time()
    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        triggered = list(pool.map(lambda _: api.trigger(dag_id), range(count)))
    posted_s = time.time() - first_sent
    ids = {run_id for run_id, _, _ in triggered}
    deadline = time.monotonic() + timeout
    while True:
        mine = [run for run in api.runs(dag_id) if run["run_id"] in ids]
        if len(mine) == len(ids) and all(run["state"] in FINISHED for run in mine):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{sum(run['state'] not in FINISHED for run in mine)} of {count} runs unfinished after {timeout:.0f}s")
        time.sleep(0.2)
    ends = [utc_seconds(run["end_date"]) for run in mine]
    failed = sum(run["state"] != "success" for run in mine)
    rate = flowstats.flows_per_second(count, first_sent, [end for end in ends if end is not None])
    posts = [elapsed for _, _, elapsed in triggered]
    return {"flows": count, "distinct_runs": len(ids), "failed": failed, "flows_per_s": round(rate, 2) if rate else None,
            "wall_s": round(max(e for e in ends if e is not None) - first_sent, 3), "posts_done_s": round(posted_s, 3),
            "post_median_ms": round(statistics.median(posts), 1), "post_p95_ms": round(flowstats.p95(posts), 1)}


def measure_stack(api: Api, dag_id: str, args: Any, label: str, meter: Any = None) -> dict[str, Any]:
    seq = one_at_a_time(api, dag_id, args.three_step_flows, args.timeout)
    e2e, seen = seq["to_end_date"], seq["seen_by_client"]
    print(f"  {label}: {e2e['n']} flows one at a time: end to end (POST sent -> run end_date) median {e2e['median_ms']:.1f} ms, "
          f"p95 {e2e['p95_ms']:.1f} ms, max {e2e['max_ms']:.1f} ms; per step {e2e['per_step_ms']:.1f} ms")
    print(f"    seen ended by the client (polling the run document every {POLL_S * 1000:.0f} ms): median {seen['median_ms']:.1f} ms, "
          f"p95 {seen['p95_ms']:.1f} ms; a POST took {seq['post_median_ms']:.1f} ms (median)")
    if meter is not None:
        meter.start()
    burst = at_once(api, dag_id, args.three_step_burst, args.timeout)
    if meter is not None:
        burst["cpu"] = meter.stop()
    print(f"  {label}: {burst['flows']} flows at once ({CLIENT_THREADS} client threads): {burst['flows_per_s']} flows/s "
          f"(the last run ended {burst['wall_s']:.2f} s after the first POST; the {burst['flows']} POSTs were answered within "
          f"{burst['posts_done_s']:.2f} s, each {burst['post_median_ms']:.0f} ms median, p95 {burst['post_p95_ms']:.0f} ms); "
          f"{burst['failed']} failed")
    if "cpu" in burst:
        from bench.workloads import print_cpu

        print_cpu(burst["cpu"])
    return {**seq, "at_once": burst}


# --- the stacks ---------------------------------------------------------------------------------


def sqlite_stack(ctx: Any) -> dict[str, Any]:
    """`manage.py run_local` (what `make run` starts) on a free port, its own state directory and
    SQLite file, importing only the three-step DAG; the admin user's token from `create_api_token`."""
    from bench.workloads import kill_leftovers, stack_rss, wait_for_line
    from orchestrator.local.embedded_redis import free_port

    home = ctx.workdir / "three-step-sqlite"
    (home / "dags").mkdir(parents=True)
    (home / "dags" / "three_step.json").write_text(json.dumps(three_step_spec()))
    env = {k: v for k, v in ctx.original_env.items() if k not in ("REDIS_URL", "DEBUG", "DATABASE_URL", "ORCHESTRATOR_PRELOAD_MODULES")}
    env.update(DATABASE_URL=f"sqlite:///{home / 'orchestrator.sqlite3'}", PYTHONUNBUFFERED="1", ORCHESTRATOR_SPOOL_DIR=str(home / "spool"),
               SECRET_KEY=env.get("SECRET_KEY") or "bench-only", PYTHONPATH=str(ROOT))
    port = free_port()
    runner = ctx.processes.start_command("three-step-run-local", [sys.executable, str(MANAGE), "run_local", "--port", str(port),
                                                                  "--state-dir", str(home / "var"), "--dags", str(home / "dags")], env=env)
    members: dict[int, str] = {}
    try:
        up = wait_for_line(ctx, runner, "is running at", ctx.args.timeout)
        members = stack_rss(runner.pid)["pids"]
        token = subprocess.run([sys.executable, str(MANAGE), "create_api_token", "admin"], env=env, cwd=ROOT, check=True,
                               capture_output=True, text=True).stdout.strip().splitlines()[-1]
        print(f"\n  run_local (SQLite, embedded Redis, runserver, 2 workers) is up after {up:.1f} s on port {port}")
        return measure_stack(Api(port, token), DAG_ID, ctx.args, "SQLite (make run)")
    finally:
        ctx.processes.stop([runner], timeout=90)
        kill_leftovers(members)


def start_gunicorn(ctx: Any, conn_max_age: int | None = None) -> tuple[Child, Api]:
    """gunicorn as the compose file runs it (3 sync workers), on the benchmark's PostgreSQL and
    Redis, with the timing middleware; a superuser `bench` and its token. With `conn_max_age`,
    its DATABASE_URL says how long Django keeps each process's connection (0: a new one per request;
otherwise the WSGI app's own default, orchestrator/wsgi.py)."""
    from io import StringIO

    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from orchestrator.local.embedded_redis import free_port

    user_model = get_user_model()
    if not user_model.objects.filter(username="bench").exists():
        user_model.objects.create_superuser("bench", "bench@example.com", None)
    out = StringIO()
    call_command("create_api_token", "bench", stdout=out)
    port = free_port()
    env = {**ctx.processes.env, **PLAIN_HTTP, "DJANGO_SETTINGS_MODULE": "bench.web_settings"}
    if conn_max_age is not None:
        env["DATABASE_URL"] += f"?conn_max_age={conn_max_age}"
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    web = ctx.processes.start_command("three-step-gunicorn", [gunicorn, "orchestrator.wsgi", "-b", f"127.0.0.1:{port}", "--workers", "3"],
                                      env=env)
    wait_http(port, ctx.processes.check_alive, 60)
    return web, Api(port, out.getvalue().strip())


def postgres_stack(ctx: Any) -> dict[str, Any]:
    from bench import procfs
    from bench.stack import make_dag
    from bench.workloads import CpuMeter, ensure_stack
    from orchestrator.models import Dag

    ensure_stack(ctx, ctx.args.concurrency)
    if not Dag.objects.filter(dag_id=DAG_ID).exists():
        make_dag(DAG_ID, STEPS, max_active_runs=1000)
    web, api = start_gunicorn(ctx)
    try:
        print(f"\n  PostgreSQL: scheduler, {ctx.args.workers} workers, gunicorn with 3 workers on port {api.port}")
        meter = CpuMeter(ctx)  # the burst's CPU: the web server's processes too
        meter.labels[os.getpid()] = "bench (the 16 client threads, polling)"
        meter.labels[web.pid] = "gunicorn master"
        for n, pid in enumerate(procfs.children(web.pid), 1):
            meter.labels[pid] = f"gunicorn worker {n}"
        return measure_stack(api, DAG_ID, ctx.args, "PostgreSQL", meter=meter)
    finally:
        ctx.processes.stop([web])


def three_step(ctx: Any, floor: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"errors": []}
    for name, run in (("sqlite", sqlite_stack), ("postgresql", postgres_stack)):
        try:
            out[name] = run(ctx)
            if out[name]["at_once"]["failed"]:
                out["errors"].append(f"{name}: {out[name]['at_once']['failed']} runs failed")
        except Exception as exc:
            import traceback

            traceback.print_exc()
            out["errors"].append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    if floor:
        print(f"\n  floor, plain RQ with {floor['workers']} x {floor['worker_class']}, three `python -c pass` jobs, each enqueuing the next: "
              f"median {floor['median_ms']:.1f} ms, p95 {floor['p95_ms']:.1f} ms (per step {floor['per_step_ms']:.1f} ms) over "
              f"{floor['n']} flows one at a time; {floor['flows_per_s']:.1f} flows/s for {floor['burst']} at once")
    return out


# --- one request of each kind on the idle stack --------------------------------------------------


def api_profile_both(ctx: Any) -> dict[str, Any]:
    """The PostgreSQL stack (scheduler, workers) at rest; gunicorn as the compose file runs it, then
    with a new database connection for each request (conn_max_age=0 in its DATABASE_URL), as every
    request had before the WSGI app kept its connections."""
    from bench.stack import make_dag
    from bench.workloads import ensure_stack
    from orchestrator.models import Dag

    ensure_stack(ctx, ctx.args.concurrency)
    if not Dag.objects.filter(dag_id=DAG_ID).exists():
        make_dag(DAG_ID, STEPS, max_active_runs=1000)
    out: dict[str, Any] = {"errors": []}
    for label, age in (("as_compose", None), ("connection_per_request", 0)):
        web, api = start_gunicorn(ctx, conn_max_age=age)
        try:
            print(f"\n  gunicorn, 3 workers, {'as the compose file runs it' if age is None else 'a new database connection per request'}:")
            out[label] = api_profile(ctx, api, cprofile=age is None)
        finally:
            ctx.processes.stop([web])
    return out


def api_profile(ctx: Any, api: Api, samples: int = 30, cprofile: bool = True) -> dict[str, Any]:
    """On the idle PostgreSQL stack (the flows above all ended): `samples` times, one POST of a
    run of the three-step DAG, once it ended one GET of its document, and one /healthz; each with
    the client's time and the server's (Server-Timing: in Django, in SQL, statements)."""
    from orchestrator.models import DagRun

    rows: dict[str, list[tuple[float, dict[str, float]]]] = {"POST runs": [], "GET run": [], "GET /healthz": []}
    for _ in range(samples + 1):
        run_id, timing, elapsed = api.trigger(DAG_ID)
        rows["POST runs"].append((elapsed, timing))
        deadline = time.monotonic() + ctx.args.timeout
        while DagRun.objects.filter(dag__dag_id=DAG_ID, run_id=run_id, state__in=FINISHED).count() == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {run_id} unfinished after {ctx.args.timeout:.0f}s")
            time.sleep(0.02)
        time.sleep(0.2)  # idle: the workers' and scheduler's work for it is over
        _, timing, elapsed = api.run(DAG_ID, run_id)
        rows["GET run"].append((elapsed, timing))
        rows["GET /healthz"].append((api.healthz(), {}))
    out: dict[str, Any] = {}
    print(f"  one request at a time on the idle stack, medians over {samples}:")
    for name, values in rows.items():
        values = values[1:]
        client = statistics.median(v for v, _ in values)
        row: dict[str, Any] = {"client_ms": round(client, 2)}
        if values[0][1]:
            for key in ("app", "db", "queries"):
                row[f"server_{key}"] = round(statistics.median(t.get(key, float("nan")) for _, t in values), 2)
        out[name] = row
        extra = (f"; in Django {row['server_app']:.1f} ms, of which SQL {row['server_db']:.1f} ms in {row['server_queries']:.0f} statements"
                 if "server_app" in row else "")
        print(f"    {name:<14} client {client:6.1f} ms{extra}")
    if cprofile:
        out["cprofile"] = profile_in_process()
    return out


def profile_in_process(top: int = 25) -> dict[str, list[str]]:
    """The same two requests through Django's test client in this process, under cProfile: the
    functions that take the time (cumulative), as text."""
    import cProfile
    import io
    import pstats

    from django.test import Client

    from orchestrator.api.tokens import create_token
    from orchestrator.models import DagRun

    client = Client(HTTP_AUTHORIZATION=f"Bearer {create_token(_bench_user())}", headers={"host": "127.0.0.1"})
    client.post(f"/api/v1/dags/{DAG_ID}/runs", data="{}", content_type="application/json")  # warm
    out: dict[str, list[str]] = {}
    for name, call in (
        ("POST runs", lambda: client.post(f"/api/v1/dags/{DAG_ID}/runs", data="{}", content_type="application/json")),
        ("GET run", lambda: client.get(f"/api/v1/dags/{DAG_ID}/runs/{_last_run_id(DagRun)}")),
    ):
        profile = cProfile.Profile()
        response = profile.runcall(call)
        out[name] = []
        # The project's own functions and the API framework's by cumulative time, then what
        # spends time itself (the wrappers of Django's handler are left out: each holds it all).
        for order, restriction in (("cumulative", r"orchestrator/|ninja/(operation|signature)|auth"), ("tottime", "")):
            stream = io.StringIO()
            stats = pstats.Stats(profile, stream=stream).sort_stats(order)
            stats.print_stats(*((restriction, top) if restriction else (top // 2,)))
            out[name] += [line for line in stream.getvalue().splitlines() if line.strip()]
        print(f"\n  cProfile of one {name} in-process (status {response.status_code}):")
        for line in out[name]:
            print(f"    {line[:200]}")
    return out


def _bench_user() -> Any:
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get(username="bench")


def _last_run_id(model: Any) -> str:
    from urllib.parse import quote

    return quote(model.objects.filter(dag__dag_id=DAG_ID).order_by("-id").values_list("run_id", flat=True)[0], safe="")


# --- a chain whose task module imports heavy libraries, with and without preloading it ----------


def preload_chain(ctx: Any) -> dict[str, Any]:
    """`--chain-length` no-op tasks in sequence whose module (bench/heavy.py) imports Django's admin
    and jsonschema; the workers' fork servers preload `bench.tasks` only, then `bench.tasks,bench.heavy`.
    Per step: the run's queued_at -> end_date over the number of tasks (what a user of a chain waits)."""
    from bench.stack import make_dag
    from bench.workloads import ensure_stack, failures, run_once, stop_stack
    from orchestrator.models import DagRun

    n = ctx.args.chain_length
    dag = make_dag("bench_chain_heavy", {f"t{i:03d}": [f"t{i - 1:03d}"] if i else [] for i in range(n)}, python_callable="bench.heavy.noop")
    out: dict[str, Any] = {"errors": []}
    saved = ctx.processes.env
    for label, modules in (("without", "bench.tasks"), ("with", "bench.tasks,bench.heavy")):
        stop_stack(ctx)
        ctx.processes.env = {**saved, "ORCHESTRATOR_PRELOAD_MODULES": modules}
        try:
            ensure_stack(ctx, ctx.args.concurrency)
        finally:
            ctx.processes.env = saved
        print(f"\n  ORCHESTRATOR_PRELOAD_MODULES={modules}")
        result, _ = run_once(ctx, f"chain-heavy-{label}-preload", dag)
        run = DagRun.objects.filter(dag=dag).order_by("-id").first()
        per_step = (run.end_date - run.queued_at).total_seconds() * 1000 / n
        out[label] = {"per_step_ms": round(per_step, 2), "gap_median_ms": round(result.series["edge_start"].median_ms(), 2),
                      "run_median_ms": round(result.series["run"].median_ms(), 2), "preload": modules}
        out["errors"] += failures(result)
        print(f"  {label} the preload: per step end to end (queued_at -> end_date / {n}) {per_step:.1f} ms; "
              f"end -> next start median {out[label]['gap_median_ms']:.1f} ms; a task's start -> end median {out[label]['run_median_ms']:.1f} ms")
    stop_stack(ctx)  # the next workload starts workers with the benchmark's own preload
    out["per_step_with_ms"] = out["with"]["per_step_ms"]
    out["per_step_without_ms"] = out["without"]["per_step_ms"]
    return out
