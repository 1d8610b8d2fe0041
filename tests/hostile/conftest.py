"""Fixtures for hostile tasks: a task user made for the test run, and workers that run their
tasks as it.

A task user must be able to run the interpreter, the checkout and the virtualenv. Where the
interpreter lives in a directory that user cannot enter (a Python under /root, mode 0700), the
worker is started in a mount namespace of its own in which /root is a bare directory any user
may pass through, holding only the interpreter's tree: nothing outside the test changes, and
the namespace ends with the worker. Without root, useradd or unshare, these tests skip.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, stop_group
from tests.worker.conftest import make_dag, queue_name, scheduler_settings, worker  # noqa: F401  fixtures reused here

# Enough of /root for the interpreter: the rest of it stays out of sight.
NAMESPACE_SCRIPT = r"""
set -e
mount --make-rprivate /
mkdir -p "$SHADOW"
mount --bind /root "$SHADOW"
mount -t tmpfs -o mode=0711 orchestrator-test /root
for entry in $KEEP; do
  mkdir -p "/root/$entry"
  mount --bind "$SHADOW/$entry" "/root/$entry"
done
exec "$@"
"""


def _runs_as(uid: int, gid: int, prefix: list[str]) -> bool:
    """Whether that user can start the interpreter and import the project's settings."""
    probe = [*prefix, "setpriv", "--reuid", str(uid), "--regid", str(gid), "--clear-groups", sys.executable, "-c", "import django, orchestrator"]
    try:
        return subprocess.run(probe, cwd=ROOT, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _namespace_prefix() -> list[str] | None:
    """The command that starts a process with the interpreter reachable by any user, when it is
    under /root; [] when it is reachable already; None when it cannot be done here."""
    interpreter = Path(os.path.realpath(sys.executable))
    if not interpreter.is_relative_to("/root"):
        return []
    if shutil.which("unshare") is None:
        return None
    keep = interpreter.relative_to("/root").parts[0]
    shadow = tempfile.mkdtemp(prefix="orchestrator-root-shadow-")
    return ["env", f"SHADOW={shadow}", f"KEEP={keep}", "unshare", "--mount", "--", "sh", "-c", NAMESPACE_SCRIPT, "namespace"]


class TaskUserFixture:
    def __init__(self, name: str, uid: int, gid: int, prefix: list[str]) -> None:
        self.name, self.uid, self.gid, self.prefix = name, uid, gid, prefix


@pytest.fixture(scope="session")
def task_user() -> Iterator[TaskUserFixture]:
    """A user made for this test run (removed afterwards), that tasks run as."""
    if os.geteuid() != 0:
        pytest.skip("a task user needs the tests to run as root")
    if shutil.which("useradd") is None or shutil.which("setpriv") is None:
        pytest.skip("no useradd or setpriv here to make a task user")
    prefix = _namespace_prefix()
    if prefix is None:
        pytest.skip("the interpreter is under /root and there is no unshare to reach it as another user")
    name = f"orchtask{os.getpid() % 100000}"
    made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"could not make a task user: {made.stderr.strip()}")
    try:
        import pwd

        entry = pwd.getpwnam(name)
        if not _runs_as(entry.pw_uid, entry.pw_gid, prefix):
            pytest.skip(f"user {name} cannot run {sys.executable} with the checkout's packages, even in a mount namespace")
        yield TaskUserFixture(name, entry.pw_uid, entry.pw_gid, prefix)
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        shadow = next((part.split("=", 1)[1] for part in prefix if part.startswith("SHADOW=")), None)
        if shadow:
            shutil.rmtree(shadow, ignore_errors=True)


@pytest.fixture
def worker_files() -> Iterator[dict[str, Path]]:
    """The worker's directories in a place any user may pass through (unlike pytest's own
    temporary directories, mode 0700): only the worker's own modes may keep a task out."""
    base = Path(tempfile.mkdtemp(prefix="orchestrator-hostile-"))
    os.chmod(base, 0o755)
    try:
        yield {"spool": base / "spool", "output": base / "output"}
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def guarded_worker(process_env, queue_name, scheduler_settings, worker_files, task_user) -> Iterator[Callable[..., subprocess.Popen]]:  # noqa: F811
    """Start `run_worker <queue>` whose tasks run as the task user; killed at teardown."""
    procs: list[tuple[subprocess.Popen, list[str]]] = []

    def start(**env: Any) -> subprocess.Popen:
        merged = {
            **process_env,
            "ORCHESTRATOR_HEARTBEAT_INTERVAL": "0.2",
            "ORCHESTRATOR_SPOOL_DIR": str(worker_files["spool"]),
            "ORCHESTRATOR_TASK_OUTPUT_DIR": str(worker_files["output"]),
            "ORCHESTRATOR_TASK_USER": task_user.name,
            **{k: str(v) for k, v in env.items()},
        }
        proc = subprocess.Popen(
            [*task_user.prefix, sys.executable, str(ROOT / "manage.py"), "run_worker", queue_name],
            env=merged,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        lines: list[str] = []
        proc.log_lines = lines  # type: ignore[attr-defined]  # what it logged so far
        threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True).start()
        procs.append((proc, lines))
        return proc

    yield start
    for proc, lines in procs:
        stop_group(proc)
        print(f"--- worker {proc.pid} ---\n{''.join(lines)}")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def platform_names(block: list[str]) -> set[str]:
    """The platform's names among `NAME=value` entries: what no task may find in an environment."""
    names = {entry.partition("=")[0] for entry in block}
    return {name for name in names if name in {"SECRET_KEY", "DATABASE_URL", "REDIS_URL"} or name.startswith("ORCHESTRATOR_")}
