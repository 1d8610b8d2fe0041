"""Task callables of the fault suite and the soak run (importable by the worker's task processes).

`recorded` writes what the invariant checker needs: a start, a tick about every 0.1 s while it
lives, and an end, each with its pid and attempt ("try.infra"); at every record it also notes any
earlier copy of itself (another pid that recorded a start for the same task instance) still
alive. The others misbehave in one way each.
"""
from __future__ import annotations

import gc
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TICK = 0.1


def _append(path: str, record: dict[str, Any]) -> None:
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)  # one write of a short line with O_APPEND: never interleaved
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class Recorder:
    def __init__(self, records: str, context: dict[str, Any]) -> None:
        Path(records).mkdir(parents=True, exist_ok=True)
        self.path = os.path.join(records, f"{os.getpid() % 8}.jsonl")
        self.records = records
        self.key = {"dag_id": context["dag_id"], "run_id": context["run_id"], "task_id": context["task_id"]}
        self.attempt = f"{context['try_number']}.{context['infrastructure_try_number']}"

    def _others_alive(self) -> list[int]:
        me = os.getpid()
        others = set()
        for file in Path(self.records).glob("*.jsonl"):
            for line in file.read_text().splitlines():
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if r.get("event") == "start" and r["pid"] != me and all(r.get(k) == v for k, v in self.key.items()):
                    others.add(r["pid"])
        return sorted(pid for pid in others if _alive(pid))

    def record(self, event: str, check: bool = True) -> None:
        others = self._others_alive() if check else []
        _append(self.path, {**self.key, "event": event, "pid": os.getpid(), "attempt": self.attempt, "at": time.time(), "others_alive": others})


def recorded(
    records: str,
    seconds: float = 0.0,
    context: dict[str, Any] | None = None,
    long_until_platform_try: int = 1,
    fail_user_tries: int = 0,
    marker: str | None = None,
    hold_until: str | None = None,
) -> str:
    """Records start, ticks and end. Runs `seconds` on platform tries below
    `long_until_platform_try` (then at once), and raises on its first `fail_user_tries` user tries.
    `marker`: a file written once it has started, so a test can wait for it. `hold_until`: a file
    whose creation ends those `seconds` early, so a test decides when the task ends."""
    assert context is not None
    recorder = Recorder(records, context)
    recorder.record("start")
    if marker:
        Path(marker).write_text(str(os.getpid()))
    if context["infrastructure_try_number"] < long_until_platform_try:
        end = time.monotonic() + seconds
        ticks = 0
        while time.monotonic() < end and not (hold_until and os.path.exists(hold_until)):
            time.sleep(min(TICK, max(0.0, end - time.monotonic())))
            ticks += 1
            recorder.record("tick", check=ticks % 5 == 0)
    if context["try_number"] <= fail_user_tries:
        recorder.record("end")
        raise ValueError(f"planned failure on try {context['try_number']}")
    recorder.record("end")
    return "done"


def quick(records: str, seconds: float = 0.0, fail: bool = False, context: dict[str, Any] | None = None) -> str:
    """A short recorded task for the soak run: runs `seconds` every time, fails if `fail`."""
    assert context is not None
    recorder = Recorder(records, context)
    recorder.record("start")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(TICK, max(0.0, end - time.monotonic())))
        recorder.record("tick", check=False)
    recorder.record("end")
    if fail:
        raise RuntimeError("soak: planned application failure")
    return "done"


def print_then_close_stdout(megabytes: int) -> str:
    """Prints `megabytes` MB, then closes its stdout and stderr, then returns."""
    line = "y" * 1023 + "\n"
    for _ in range(megabytes * 1024):
        sys.stdout.write(line)
    sys.stdout.flush()
    os.close(1)
    os.close(2)
    return "closed"


def grandchild_ignoring_sigterm(marker: str, seconds: float = 60.0) -> None:
    """Starts a grandchild in its group that ignores SIGTERM, then runs long itself."""
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    child = subprocess.Popen([sys.executable, "-c", code])
    Path(marker).write_text(str(child.pid))
    time.sleep(seconds)


def setsid_escapee(marker: str, seconds: float = 60.0) -> None:
    """Starts a grandchild that calls setsid() (leaves the task's process group and session)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    Path(marker).write_text(str(child.pid))
    time.sleep(seconds)


def setsid_escapee_then_return(marker: str) -> str:
    """Starts a setsid() grandchild and returns at once, leaving it behind."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    Path(marker).write_text(str(child.pid))
    return "left one behind"


def exhaust_memory(limit_mb: int = 200) -> None:
    """Caps its own address space `limit_mb` above what it uses now, then allocates past it."""
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
    cap = vm + limit_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    hog = []
    while True:
        hog.append(bytearray(16 * 1024 * 1024))


def leave_zombies(count: int, marker: str) -> str:
    """Forks `count` children that exit at once and are never waited for, then returns."""
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        pids.append(pid)
    Path(marker).write_text(json.dumps(pids))
    time.sleep(0.3)  # they are zombies now, children of this process
    return "left zombies"


def unpicklable() -> Any:
    """Returns a value that neither JSON nor pickle can carry (a lambda inside a generator)."""
    return {"fn": lambda: 1, "gen": (i for i in range(3)), "sock": __import__("socket").socket()}


class StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this exception raises")

    def __repr__(self) -> str:
        raise RuntimeError("repr() of this exception raises")


def raise_unprintable() -> None:
    raise StrRaises("boom")


def sigterm_survivor_group(marker: str) -> None:
    """Ignores SIGTERM itself (no on_kill), so only SIGKILL ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(marker).write_text(str(os.getpid()))
    time.sleep(120)


def big_result(megabytes: int) -> str:
    gc.collect()
    return "z" * (megabytes * 1024 * 1024)


class RecordedSleeper:
    """`recorded` as a task class whose on_kill writes why it was stopped."""

    def __init__(self, records: str, seconds: float, on_kill_file: str) -> None:
        self.records = records
        self.seconds = seconds
        self.on_kill_file = on_kill_file

    def execute(self, context: dict[str, Any]) -> str:
        return recorded(self.records, self.seconds, context)

    def on_kill(self, execution_context: Any) -> None:
        Path(self.on_kill_file).write_text(json.dumps({**execution_context.to_dict(), "pid": os.getpid()}))


def setsid_child_that_exits(marker: str, seconds: float = 1.0) -> str:
    """Starts a grandchild that calls setsid() and exits `seconds` later, and returns at once: the
    grandchild ends as an orphan outside the task's group, a zombie until someone reaps it."""
    child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"], start_new_session=True)
    Path(marker).write_text(str(child.pid))
    return "left one behind"


def secrets_seen(hex_needles: list[str], context: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """Where this task process can find each secret (given hex-encoded, so the needles are not in
    the fork server's memory through this call): its settings, its objects, its environment,
    its parent's (the fork server's) environment and whole memory."""
    import django.conf

    needles = [bytes.fromhex(h) for h in hex_needles]
    places: dict[str, bytes] = {}
    settings = django.conf.settings
    places["settings.SECRET_KEY"] = str(settings.SECRET_KEY).encode()
    places["settings.DATABASES"] = repr(settings.DATABASES).encode()
    places["settings.REDIS_URL"] = str(getattr(settings, "REDIS_URL", "")).encode()
    places["os.environ"] = repr(dict(os.environ)).encode()
    places["gc objects"] = b"\0".join(o.encode(errors="replace") for o in gc.get_objects() if isinstance(o, str)) + b"\0".join(
        repr(o).encode(errors="replace") for o in gc.get_objects() if isinstance(o, dict)
    )
    parent = os.getppid()
    places["/proc/parent/environ"] = Path(f"/proc/{parent}/environ").read_bytes()
    places["/proc/parent/mem"] = _memory_of(parent)
    found: dict[str, list[str]] = {}
    for hex_needle, needle in zip(hex_needles, needles):
        found[hex_needle] = [place for place, data in places.items() if needle in data]
    return found


def _memory_of(pid: int) -> bytes:
    """Every readable mapping of `pid`, joined (the fork server's memory is what a forked task
    inherits)."""
    chunks = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            addresses, perms = line.split()[:2]
            if not perms.startswith("r") or "[vvar]" in line or "[vsyscall]" in line:
                continue
            start, end = (int(a, 16) for a in addresses.split("-"))
            try:
                mem.seek(start)
                chunks.append(mem.read(end - start))
            except (OSError, ValueError, OverflowError):
                continue
    return b"\0".join(chunks)


def hostile_output(kind: str, records: str | None = None, context: dict[str, Any] | None = None) -> Any:
    """What users' code hands back at its worst: `invalid_utf8` (raw bytes that are no UTF-8 on
    stdout and stderr), `huge` (5 MB of output), `nul_output`, `nul_exception`, `nul_result`
    (a NUL character, which PostgreSQL's text refuses, in the output, an exception's message,
    or the result)."""
    if records and context is not None:
        recorder = Recorder(records, context)
        recorder.record("start")
        recorder.record("end")
    if kind == "invalid_utf8":
        os.write(1, b"caf\xe9 \xff\xfe \xc3( \xed\xa0\x80 lone surrogate\n")
        os.write(2, b"\x80\x81 not utf-8\n")
        return "wrote invalid utf-8"
    if kind == "huge":
        chunk = "x" * 1023 + "\n"
        for _ in range(5 * 1024):
            sys.stdout.write(chunk)
        return "wrote 5 MB"
    if kind == "nul_output":
        print("before\x00after")
        return "wrote a NUL"
    if kind == "nul_exception":
        raise ValueError("bad 'a\x00b'")
    if kind == "nul_result":
        return "a\x00b"
    raise ValueError(f"unknown kind {kind!r}")


def print_unterminated_then_succeed(text: str) -> str:
    """Prints without a newline (left in Python's buffer) and succeeds at once: its output must
    reach the report, which is made before its process has ended."""
    print(text, end="")
    sys.stderr.write(text)
    return "done"


def succeed_leaving_a_child(marker: str) -> str:
    """Succeeds while a child it started (in its group) sleeps on: the child must not outlive
    the attempt, though the success is reported before the task's process is over."""
    child = subprocess.Popen(["sleep", "60"])
    Path(marker).write_text(str(child.pid))
    return "done"
