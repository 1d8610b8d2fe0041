"""Run the whole stack on one machine: web, one scheduler and workers, as child processes.

`python manage.py run_local` (what `make run` calls) prepares the database (migrate, the
example DAGs, an `admin` user), starts the bundled Redis server when REDIS_URL is not set,
starts the processes with their output prefixed by name, prints the URL and the login once
they are up, and on Ctrl-C or SIGTERM stops every child: workers get SIGTERM and their
shutdown grace, Redis stops last so that workers can still report. While it runs, a runtime
file in the state directory tells commands in other terminals where its database and Redis
are (see `orchestrator.local.stack_file`).
"""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import get_commands
from django.db import connections

from orchestrator.data.taskconfig import merge_args
from orchestrator.local import stack_file
from orchestrator.local.embedded_redis import (
    EmbeddedRedis,
    EmbeddedRedisError,
    die_with_parent,
)
from orchestrator.models import Dag

MANAGE = Path(__file__).resolve().parents[2] / "manage.py"
ADMIN_USERNAME = "admin"
DAG_SUFFIXES = (".yaml", ".yml", ".json")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
# runserver speaks plain HTTP and has no proxy in front: with DEBUG off, production's HTTPS-only
# defaults would redirect every page to https:// and keep the login cookie from being sent.
PLAIN_HTTP = {
    "SECURE_SSL_REDIRECT": "0",
    "SESSION_COOKIE_SECURE": "0",
    "CSRF_COOKIE_SECURE": "0",
    "SECURE_PROXY_SSL_HEADER": "",
}


# A worker that dies this soon after its start, this many times in a row, is broken, not killed:
# the stack stops rather than restart it for ever.
QUICK_DEATH = 10.0
RESTARTS_OF_A_FAILING_WORKER = 3


class LocalRunError(RuntimeError):
    """The local stack could not be prepared or started."""


@dataclass
class Child:
    """One long-running process of the stack."""

    name: str
    args: list[str]
    stop_timeout: float
    process: subprocess.Popen[str] | None = None
    reader: threading.Thread | None = field(default=None, repr=False)
    started_at: float = 0.0
    quick_deaths: int = 0  # deaths in a row within QUICK_DEATH of a start

    def exit_code(self) -> int | None:
        """The code the process exited with; None while it runs, or before it is started."""
        return None if self.process is None else self.process.poll()


class TextStream(Protocol):
    """Where the output goes: a text file, or a management command's stdout."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> None: ...


class Output:
    """Every process's lines on one stream, each prefixed with the process's name."""

    def __init__(self, stream: TextStream, width: int = 12) -> None:
        self.stream = stream
        self.width = width
        self.lock = threading.Lock()
        self.last_line_at = time.monotonic()

    def line(self, name: str, text: str) -> None:
        with self.lock:
            self.stream.write(f"{name:<{self.width}}| {text.rstrip()}\n")
            self.stream.flush()
            self.last_line_at = time.monotonic()

    def block(self, text: str) -> None:
        with self.lock:
            self.stream.write(text)
            self.stream.flush()

    def follow(self, name: str, pipe: IO[str]) -> threading.Thread:
        def pump() -> None:
            for text in pipe:
                self.line(name, text)

        thread = threading.Thread(target=pump, name=f"output-{name}", daemon=True)
        thread.start()
        return thread


class LocalStack:
    """Prepares and supervises the local processes; `run()` returns the exit code."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        workers: int = 2,
        concurrency: int | None = None,
        state_dir: Path | None = None,
        dags_dir: Path | None = None,
        stream: TextStream | None = None,
    ) -> None:
        base = Path(settings.BASE_DIR)
        self.host = host
        self.port = port
        self.workers = workers
        self.concurrency = concurrency
        self.state_dir = Path(state_dir) if state_dir else base / "var"
        self.dags_dir = Path(dags_dir or settings.ORCHESTRATOR_DAGS_FOLDER or base / "dags")
        self.runtime_path = stack_file.runtime_file(self.state_dir)
        self.out = Output(stream or sys.stdout)
        self.children: list[Child] = []
        self.redis: EmbeddedRedis | None = None
        self.env: dict[str, str] = {}
        self.job_service: Any = None  # the examples' job service, served by this process
        self.password: str | None = None
        self.stopping = threading.Event()
        self.forced = threading.Event()
        self.queues: list[str] = ["default"]  # what the workers read: every queue of the loaded DAGs

    @property
    def url(self) -> str:
        """The address to open: a wildcard bind address is not one, so use a host name Django accepts."""
        host = (allowed_host_name() or "127.0.0.1") if self.host in WILDCARD_HOSTS else self.host
        return f"http://{host}:{self.port}/"

    # -- the whole life -------------------------------------------------------------------

    def run(self) -> int:
        self._install_signal_handlers()
        try:
            self._check_not_running()
            self._check_port_free()
            self.env = self._child_env()
            self._open_job_service()
            self.prepare()
            if self.stopping.is_set():
                return 130
            self._publish()
            self.start_children()
            self._serve_jobs()
            if not self._wait_until_serving():
                return 1 if not self.stopping.is_set() else 0
            self._wait_for_quiet()
            self._print_banner()
            return self.supervise()
        except (LocalRunError, EmbeddedRedisError) as error:
            self.say(f"error: {error}")
            return 1
        finally:
            # First, so that no command from another terminal starts on a stack going away.
            stack_file.remove_if_ours(self.runtime_path)
            self.stop_children()
            if self.job_service is not None:
                self.job_service.server_close()
            if self.redis is not None:
                self.say("stopping the embedded Redis server")
                self.redis.stop()

    def say(self, text: str) -> None:
        self.out.line("local", text)

    # -- set-up ---------------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        def handle(signum: int, frame: object) -> None:
            if self.stopping.is_set():
                self.forced.set()  # a second Ctrl-C: no more grace
            self.stopping.set()

        signal.signal(signal.SIGINT, handle)
        signal.signal(signal.SIGTERM, handle)

    def _check_not_running(self) -> None:
        """Two stacks on one state directory would share the Redis data and the runtime file."""
        other = stack_file.read_live(self.runtime_path)
        if other is not None and other.pid != os.getpid():
            raise LocalRunError(
                f"the local stack is already running (pid {other.pid}, {other.web_url}): stop it first, or use another --state-dir"
            )

    def _open_job_service(self) -> None:
        """The small job service the resumable example drives (`examples/jobservice.py`): bound
        here, served from a thread of this process once the children are started (no thread
        runs while they are forked), so that it outlives any worker killed to show a re-attach."""
        if self.env.get("EXAMPLE_JOB_SERVICE_URL"):
            return
        try:
            from examples.jobservice import JobBook, handler_for
        except ImportError:
            return
        from http.server import ThreadingHTTPServer

        for port in (8765, 0):  # the example's default port, or any free one
            try:
                self.job_service = ThreadingHTTPServer(("127.0.0.1", port), handler_for(JobBook()))
                break
            except OSError:
                continue
        if self.job_service is not None:
            self.job_service.daemon_threads = True
            self.env["EXAMPLE_JOB_SERVICE_URL"] = f"http://127.0.0.1:{self.job_service.server_port}"
            self.say(
                f"example job service: {self.env['EXAMPLE_JOB_SERVICE_URL']} (the remote jobs example_resumable drives; "
                "every submit and cancel at /events)"
            )

    def _serve_jobs(self) -> None:
        if self.job_service is not None:
            threading.Thread(target=self.job_service.serve_forever, name="example-jobs", daemon=True).start()

    def _check_port_free(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            if sock.connect_ex((self.host, self.port)) == 0:
                raise LocalRunError(f"port {self.port} on {self.host} is in use: choose another (make run PORT=8001)")

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"  # lines show up as they happen, not when a buffer fills
        if env.get("REDIS_URL"):
            self.say(f"Redis: {_redact(env['REDIS_URL'])} (from REDIS_URL)")
        else:
            self.redis = EmbeddedRedis(self.state_dir / "redis")
            env["REDIS_URL"] = self.redis.start()
            self.say(f"Redis: {env['REDIS_URL']} (embedded redis-server, data in {self.redis.data_dir})")
        # Explicit, so that the children never look for a runtime file, ours or another's.
        env["DATABASE_URL"] = stack_file.database_url(os.environ, None, Path(settings.BASE_DIR) / "var")
        database = settings.DATABASES["default"]
        self.say(f"Database: {database['ENGINE'].rsplit('.', 1)[-1]} {database['NAME']}")
        env["DEBUG"] = child_debug(self.host, os.environ)
        self._say_debug(env["DEBUG"])
        # Every process here shares the machine's disk: the workers write each attempt's whole
        # output there and the web server serves it ("none" keeps the database's head and tail only).
        env.setdefault("ORCHESTRATOR_TASK_OUTPUT_DIR", str(self.state_dir / "task-output"))
        env.update({name: value for name, value in PLAIN_HTTP.items() if name not in os.environ})
        return env

    def _say_debug(self, value: str) -> None:
        on = value.strip().lower() in ("1", "true", "yes", "on")
        if on and not is_loopback(self.host):
            self.say(f"warning: DEBUG is on and the web server listens on {self.host}: tracebacks are shown to anyone who can reach it")
        elif "DEBUG" not in os.environ:
            why = "listening on this machine only; DEBUG=0 turns it off" if on else f"listening on {self.host}; DEBUG=1 turns it on"
            self.say(f"DEBUG {'on' if on else 'off'} ({why})")

    def _publish(self) -> None:
        """Tell commands in other terminals of this checkout where the database and Redis are."""
        info = stack_file.info_for_this_process(self.env["DATABASE_URL"], self.env["REDIS_URL"], self.url)
        stack_file.write(self.runtime_path, info)

    def prepare(self) -> None:
        """Migrate, load the example DAGs and make sure there is an admin user."""
        self.say("migrating the database")
        self._manage_once("migrate", "--noinput", "-v", "0")
        if self.stopping.is_set():
            return
        self.import_dags_folder()
        if self.stopping.is_set():
            return
        self.password = ensure_admin(self.state_dir / "admin-password.txt")
        self.queues = queues_of_loaded_dags()
        connections.close_all()  # SQLite: the runner does not hold the file open while the children write

    def import_dags_folder(self) -> None:
        files = sorted(p for p in self.dags_dir.glob("*") if p.suffix in DAG_SUFFIXES) if self.dags_dir.is_dir() else []
        if not files:
            self.say(f"no DAG files in {self.dags_dir}: nothing to import")
            return
        if "import_dags" not in get_commands():
            self.say("the import_dags command is not available: DAG files not loaded")
            return
        self.say(f"importing DAGs from {self.dags_dir}")
        try:
            self._manage_once("import_dags", str(self.dags_dir))
        except LocalRunError as error:
            # The stack is still useful without the examples; say so loudly and go on.
            self.say(f"warning: {error}")

    def _manage_once(self, *args: str) -> None:
        result = subprocess.run(
            [sys.executable, str(MANAGE), *args],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for text in result.stdout.splitlines():
            self.out.line(args[0], text)
        if result.returncode != 0 and not self.stopping.is_set():  # a Ctrl-C also interrupts the step
            raise LocalRunError(f"`manage.py {' '.join(args)}` exited with code {result.returncode}")

    # -- the processes --------------------------------------------------------------------

    def planned_children(self) -> list[Child]:
        grace = float(settings.ORCHESTRATOR_WORKER_SHUTDOWN_GRACE) + float(settings.ORCHESTRATOR_KILL_GRACE)
        # --insecure: runserver serves static files even when DEBUG is off.
        children = [
            Child("web", ["runserver", f"{self.host}:{self.port}", "--noreload", "--insecure"], stop_timeout=10),
            Child("scheduler", ["run_scheduler"], stop_timeout=15),
        ]
        # Every queue a loaded DAG names, so that no example task waits for a worker nobody starts.
        worker_args = ["run_worker", *self.queues] + (["--concurrency", str(self.concurrency)] if self.concurrency else [])
        children += [Child(f"worker-{n}", worker_args, stop_timeout=grace + 10) for n in range(1, self.workers + 1)]
        return children

    def start_children(self) -> None:
        self.children = self.planned_children()
        # Start every process before any output thread exists: forking with threads running
        # is unsafe with a preexec_fn.
        for child in self.children:
            self._spawn(child)
        for child in self.children:
            self._announce(child)

    def _spawn(self, child: Child) -> None:
        child.process = subprocess.Popen(
            [sys.executable, str(MANAGE), *child.args],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,  # Ctrl-C reaches only the runner, which signals each child once
            preexec_fn=die_with_parent,
        )
        child.started_at = time.monotonic()

    def _announce(self, child: Child) -> None:
        assert child.process is not None
        assert child.process.stdout is not None
        self.say(f"started {child.name} (pid {child.process.pid}): manage.py {' '.join(child.args)}")
        child.reader = self.out.follow(child.name, child.process.stdout)

    def _exited(self) -> Child | None:
        return next((c for c in self.children if c.exit_code() is not None), None)

    def _wait_until_serving(self, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.stopping.is_set():
            dead = self._exited()
            if dead is not None:
                self.say(f"{dead.name} exited with code {dead.exit_code()} while starting; stopping")
                return False
            if self._web_answers():
                return True
            self.stopping.wait(0.2)
        if not self.stopping.is_set():
            self.say(f"the web server did not answer on {self.url}healthz within {timeout:.0f}s; stopping")
        return False

    def _web_answers(self) -> bool:
        # Through the loopback address, with a Host header that ALLOWED_HOSTS accepts: a
        # wildcard bind or a custom ALLOWED_HOSTS must not make the probe fail.
        address = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(self.host, self.host)
        request = urllib.request.Request(f"http://{address}:{self.port}/healthz")
        host = allowed_host_name()
        if host:
            request.add_header("Host", f"{host}:{self.port}")
        try:
            with urllib.request.urlopen(request, timeout=1) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _wait_for_quiet(self, quiet: float = 0.5, limit: float = 5.0) -> None:
        """Let the servers print their start-up lines first, so that the banner is the last thing on screen."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and not self.stopping.is_set():
            if time.monotonic() - self.out.last_line_at >= quiet:
                return
            self.stopping.wait(0.05)

    def _print_banner(self) -> None:
        login = f"{ADMIN_USERNAME} / {self.password}" if self.password else f"{ADMIN_USERNAME} (password set earlier; not stored)"
        self.out.block(
            "\n"
            f"  Orchestrator is running at {self.url}\n"
            f"  Login: {login}\n"
            f"  API:   {self.url}api/v1/dags    Metrics: {self.url}metrics\n"
            "  Press Ctrl-C to stop.\n\n"
        )

    def supervise(self) -> int:
        """Wait for a stop signal. A worker that dies is started again, as a cluster would (a
        `kill -9` of a worker is how the examples show a platform retry); any other process that
        dies, or a worker that keeps dying as it starts, stops everything."""
        while not self.stopping.wait(0.2):
            dead = self._exited()
            if dead is None:
                continue
            if not self._restartable(dead):
                self.say(f"{dead.name} exited with code {dead.exit_code()}; stopping everything")
                return 1
            self.say(f"{dead.name} exited with code {dead.exit_code()}; starting it again")
            if dead.reader is not None:
                dead.reader.join(timeout=2)
            self._spawn(dead)
            self._announce(dead)
        return 0

    def _restartable(self, child: Child) -> bool:
        if not child.name.startswith("worker-"):
            return False
        lived = time.monotonic() - child.started_at
        child.quick_deaths = child.quick_deaths + 1 if lived < QUICK_DEATH else 0
        return child.quick_deaths < RESTARTS_OF_A_FAILING_WORKER

    def stop_children(self) -> None:
        running = [c for c in self.children if c.process is not None and c.process.poll() is None]
        if running:
            self.say("stopping: " + ", ".join(c.name for c in running) + " (Ctrl-C again to kill at once)")
        for child in running:
            _signal(child, signal.SIGTERM)
        for child in running:
            deadline = time.monotonic() + child.stop_timeout
            assert child.process is not None
            while child.process.poll() is None and time.monotonic() < deadline and not self.forced.is_set():
                time.sleep(0.1)
            if child.process.poll() is None:
                self.say(f"{child.name} did not stop in time: killing it")
                _signal(child, signal.SIGKILL, group=True)
                child.process.wait()
        for child in self.children:
            if child.reader is not None:
                child.reader.join(timeout=2)


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_NAMES or host.startswith("127.")


def child_debug(host: str, environ: Mapping[str, str]) -> str:
    """DEBUG for the stack: as set, else on only when the web server is reachable from this
    machine alone (tracebacks in error pages must not reach other machines)."""
    if "DEBUG" in environ:
        return environ["DEBUG"]
    return "1" if is_loopback(host) else "0"


def allowed_host_name() -> str | None:
    """A host name the web app accepts (the first ALLOWED_HOSTS entry that names one)."""
    for entry in settings.ALLOWED_HOSTS:
        name = entry.lstrip(".")
        if name and name != "*":
            return name
    return None


def _signal(child: Child, signum: signal.Signals, group: bool = False) -> None:
    assert child.process is not None
    try:
        if group:
            os.killpg(child.process.pid, signum)
        else:
            child.process.send_signal(signum)
    except ProcessLookupError:
        pass


def _redact(url: str) -> str:
    """A URL without its password, fit for the console."""
    scheme, sep, rest = url.partition("://")
    if "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}" if user else f"{scheme}{sep}***@{host}"


def queues_of_loaded_dags() -> list[str]:
    """`default`, then every other queue a loaded DAG's task may be sent to (its `queue`, or
    its `queue_on_oom` after running out of memory), in name order."""
    named: set[str] = set()
    for dag in Dag.objects.prefetch_related("tasks"):
        for task in dag.tasks.all():
            args = merge_args(dag.default_args, task.args)
            named.update(q for q in (args.get("queue"), args.get("queue_on_oom")) if isinstance(q, str) and q)
    return ["default", *sorted(named - {"default"})]


def ensure_admin(password_file: Path) -> str | None:
    """Create the `admin` superuser if missing; return its password when it is known.

    The password is generated once and kept in `password_file` (mode 0600), so a re-run
    prints the same login, also after the database was reset.
    """
    stored = password_file.read_text().strip() if password_file.exists() else ""
    users = get_user_model()._default_manager
    if users.filter(username=ADMIN_USERNAME).exists():
        return stored or None
    password = stored or secrets.token_urlsafe(12)
    users.create_superuser(ADMIN_USERNAME, email="", password=password)
    if not stored:
        password_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(password + "\n")
    return password
