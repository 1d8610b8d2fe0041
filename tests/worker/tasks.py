"""Task callables the worker tests run in real task processes (importable by the worker)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.exceptions import NonRetryableError, RetryAfter


def _append(path: str, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _write_context(path: str, execution_context: Any) -> None:
    Path(path).write_text(json.dumps({**execution_context.to_dict(), "pid": os.getpid()}))


def succeed(context: dict[str, Any]) -> dict[str, Any]:
    print(f"hello from {context['task_id']} try {context['try_number']}")
    return {"task_id": context["task_id"], "try_number": context["try_number"], "conf": context["conf"]}


def fail_until(succeed_on_try: int, context: dict[str, Any]) -> str:
    if context["try_number"] < succeed_on_try:
        raise ValueError(f"not yet (try {context['try_number']})")
    return "finally"


def raise_non_retryable() -> None:
    raise NonRetryableError("bad input, retrying will not help")


def raise_retry_after(seconds: float) -> None:
    raise RetryAfter(seconds)


def print_a_lot(megabytes: int) -> None:
    """BEGIN, then `megabytes` MB of filler on both streams, then END."""
    line = b"x" * 1023 + b"\n"
    for stream in (sys.stdout.buffer, sys.stderr.buffer):
        stream.write(b"BEGIN\n")
        for _ in range(megabytes * 1024):
            stream.write(line)
        stream.write(b"END\n")
        stream.flush()


def sleep_unless_retried(seconds: float, context: dict[str, Any]) -> str:
    """Sleeps on its first platform try (to be killed); returns at once after a platform retry."""
    if context["infrastructure_try_number"] == 0:
        time.sleep(seconds)
    return "done"


def stubborn_with_child(seconds: float, marker: str) -> None:
    """Starts a grandchild in its process group, then runs long; its on_kill records the context
    and then ignores the stop, so only SIGKILL ends it."""
    child = subprocess.Popen(["sleep", "60"])
    Path(marker + ".child").write_text(str(child.pid))
    time.sleep(seconds)


def _stubborn_on_kill(execution_context: Any) -> None:
    _write_context(os.environ["TEST_ON_KILL_FILE"], execution_context)
    time.sleep(60)  # ignore the stop: only SIGKILL ends this


stubborn_with_child.on_kill = _stubborn_on_kill  # type: ignore[attr-defined]


class GracefulSleeper:
    """A task class: sleeps on its first platform try; on_kill records why it was stopped."""

    def __init__(self, seconds: float, on_kill_file: str) -> None:
        self.seconds = seconds
        self.on_kill_file = on_kill_file

    def execute(self, context: dict[str, Any]) -> str:
        if context["infrastructure_try_number"] == 0:
            time.sleep(self.seconds)
        return "done"

    def on_kill(self, execution_context: Any) -> None:
        _write_context(self.on_kill_file, execution_context)


def exclusive(path: str, seconds: float, context: dict[str, Any]) -> str:
    """Records its start and end; at start it notes any earlier copy that is still alive."""
    alive = []
    if os.path.exists(path):
        for line in Path(path).read_text().splitlines():
            record = json.loads(line)
            if record["event"] == "start" and _alive(record["pid"]):
                alive.append(record["pid"])
    _append(path, {"event": "start", "pid": os.getpid(), "at": time.time(), "others_alive": alive})
    if context["infrastructure_try_number"] == 0:
        time.sleep(seconds)
    _append(path, {"event": "end", "pid": os.getpid(), "at": time.time()})
    return "done"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def database_unreachable_once(context: dict[str, Any]) -> str:
    """Fails to connect to a database (nothing listens on port 1) on its first platform try."""
    if context["infrastructure_try_number"] == 0:
        import psycopg

        psycopg.connect("postgresql://nobody@127.0.0.1:1/none", connect_timeout=2)
    return "connected"


class Greeter:
    """A task named by `tests.worker.tasks.Greeter.greet`: a class's static method."""

    @staticmethod
    def greet(name: str) -> str:
        return f"hello {name}"


def guarded_with_child(path: str, seconds: float, context: dict[str, Any]) -> str:
    """`exclusive`, plus a grandchild in its process group whose pid it records: on its first
    platform try it runs long, so a test can kill its worker mid-task."""
    if context["infrastructure_try_number"] == 0:
        child = subprocess.Popen(["sleep", "60"])
        _append(path + ".children", {"pid": child.pid, "task_pid": os.getpid()})
    return exclusive(path, seconds, context)


def window(path: str, seconds: float, context: dict[str, Any]) -> str:
    """Records when it ran (start, end), so a test can see how many ran at once."""
    _append(path, {"event": "start", "task_id": context["task_id"], "at": time.time()})
    time.sleep(seconds)
    _append(path, {"event": "end", "task_id": context["task_id"], "at": time.time()})
    return "done"


def environment() -> dict[str, str]:
    """The task process's whole environment, as its result."""
    return dict(os.environ)


def count_dags() -> int:
    """A task that uses Django models: the fork server must not share its connection."""
    from orchestrator.models import Dag

    return Dag.objects.count()


def raise_with_nul() -> None:
    raise ValueError("bad 'a\x00b'")


def raise_with_lone_surrogate() -> None:
    raise ValueError("half a pair: \udcff")


def return_with_nul() -> str:
    return "before\x00after"


def return_unstorable_float() -> dict[str, Any]:
    """A result neither database's JSON takes (NaN), although it is not text."""
    return {"value": float("nan")}


def print_invalid_utf8() -> str:
    sys.stdout.buffer.write(b"valid, then \xff\xfe\xfd not UTF-8, then NUL \x00 end\n")
    sys.stdout.flush()
    return "printed"


def hostile_everywhere() -> dict[str, Any]:
    """NUL and invalid UTF-8 on both streams, and a result with NUL in a key and a value and a
    lone surrogate deep inside."""
    sys.stdout.buffer.write(b"out\x00put \xff\n")
    sys.stderr.buffer.write(b"err\xc3(or \x00\n")
    sys.stdout.flush()
    sys.stderr.flush()
    return {"k\x00ey": "va\x00lue", "deep": [{"pair": "half \ud800"}], "fine": "caf\u00e9"}


def set_refused_then_ok(context: dict[str, Any]) -> str:
    """Sets a key the database refuses (the test's trigger), then one it takes."""
    state = context["task_state"]
    try:
        state.set("refused", 1)
    except ValueError as exc:
        message = str(exc)
    else:
        message = "stored"
    state.set("ok", 2)
    return message


def results_and_pid(context: dict[str, Any]) -> dict[str, Any]:
    """Its upstreams' results as it was given them, and its own process."""
    return {"results": context["results"], "pid": os.getpid()}


def loaded_modules(names: list[str]) -> dict[str, bool]:
    """Which of these modules the task process has loaded as its code starts (what the fork
    server preloaded, as the task imported nothing yet)."""
    return {name: name in sys.modules for name in names}


def give(size: int, context: dict[str, Any]) -> str:
    """A string of `size` characters, named after the task (its result)."""
    return (context["task_id"] * size)[:size]


def result_sizes(context: dict[str, Any]) -> dict[str, int]:
    """How many characters each upstream's result reached this task with."""
    return {task_id: len(result) for task_id, result in context["results"].items()}
