"""Hostile tasks: each tries what a task must not be able to do and returns what happened, so
the tests can assert on the result (the task itself succeeds whatever it was refused)."""
from __future__ import annotations

import ctypes
import errno
import os
import signal
import time
from pathlib import Path
from typing import Any

PTRACE_ATTACH = 16
PTRACE_DETACH = 17


def _outcome(action) -> str:
    """"ok" when the action worked, else the errno's name (or the exception's type)."""
    try:
        action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    except Exception as exc:
        return type(exc).__name__
    return "ok"


def environ_block(pid: int) -> list[str] | str:
    """The `NAME=value` entries of /proc/PID/environ (what the kernel shows, whatever os.environ
    says), or the errno's name when it cannot be read."""
    try:
        return [entry for entry in Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0") if entry]
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, type(exc).__name__)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def ptrace_attach(pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(PTRACE_ATTACH, pid, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    libc.ptrace(PTRACE_DETACH, pid, 0, 0)


def who_am_i(context: dict[str, Any]) -> dict[str, Any]:
    """The task's credentials, home and working directory, and its environment's names."""
    home = os.environ.get("HOME", "")
    stat = os.stat(home) if home else None
    return {
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "gid": os.getgid(),
        "groups": os.getgroups(),
        "home": home,
        "tmpdir": os.environ.get("TMPDIR"),
        "cwd": os.getcwd(),
        "home_mode": oct(stat.st_mode & 0o777) if stat else None,
        "home_owner": stat.st_uid if stat else None,
        "environment": sorted(os.environ),
        "environment_values": "\n".join(os.environ.values()),
        # What the kernel shows as its environment: the block it was started (forked) with.
        "proc_environment": environ_block(os.getpid()),
        "server_proc_environment": environ_block(os.getppid()),
    }


def attack_the_platform(directories: list[str], files: list[str], context: dict[str, Any]) -> dict[str, Any]:
    """Try to list, write into and read the worker's directories, read and delete its files (by
    name, as an attacker who guessed them would), read the worker's and the fork server's
    environment and memory, signal and trace them. Signal 0 asks only whether a signal would be
    let through; SIGCONT would do no harm if it were."""
    server = os.getppid()
    worker = parent_of(server)
    found: dict[str, Any] = {"server": server, "worker": worker}
    for name, pid in (("worker", worker), ("server", server)):
        found[f"environ {name}"] = _outcome(lambda pid=pid: Path(f"/proc/{pid}/environ").read_bytes())
        found[f"mem {name}"] = _outcome(lambda pid=pid: open(f"/proc/{pid}/mem", "rb").close())
        found[f"signal {name}"] = _outcome(lambda pid=pid: os.kill(pid, signal.SIGCONT))
        found[f"may signal {name}"] = _outcome(lambda pid=pid: os.kill(pid, 0))
        found[f"ptrace {name}"] = _outcome(lambda pid=pid: ptrace_attach(pid))
    for path in directories:
        found[f"list {path}"] = _outcome(lambda path=path: os.listdir(path))
        found[f"write {path}"] = _outcome(lambda path=path: Path(path, "ti-1-1.json").write_text("{}"))
    for path in files:
        found[f"read {path}"] = _outcome(lambda path=path: Path(path).read_bytes())
        found[f"delete {path}"] = _outcome(lambda path=path: os.unlink(path))
    return found


def attack_another_attempt(cmdline: str, seconds: float = 30.0) -> dict[str, Any]:
    """Find another attempt's process by its command line (/proc is readable), then try to
    signal it, trace it and read its environment and memory; and, for contrast, signal a child
    of its own."""
    wanted = cmdline.replace(" ", "\0").encode() + b"\0"
    deadline = time.monotonic() + seconds
    victim = None
    while victim is None and time.monotonic() < deadline:
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    if Path(f"/proc/{name}/cmdline").read_bytes() == wanted:
                        victim = int(name)
                except OSError:
                    continue
        time.sleep(0.1)
    if victim is None:
        return {"victim": None}
    found: dict[str, Any] = {"victim": victim}
    found["may signal"] = _outcome(lambda: os.kill(victim, 0))
    found["signal"] = _outcome(lambda: os.kill(victim, signal.SIGCONT))
    found["ptrace"] = _outcome(lambda: ptrace_attach(victim))
    found["environ"] = _outcome(lambda: Path(f"/proc/{victim}/environ").read_bytes())
    found["mem"] = _outcome(lambda: open(f"/proc/{victim}/mem", "rb").close())
    child = os.fork()
    if child == 0:
        time.sleep(30)
        os._exit(0)
    found["signal own child"] = _outcome(lambda: os.kill(child, signal.SIGKILL))
    os.waitpid(child, 0)
    return found


def own_memory(seconds: float) -> dict[str, float]:
    """This process's proportional and resident set sizes (MiB), after `seconds` of being
    measured by its worker."""
    time.sleep(seconds)
    rollup = Path("/proc/self/smaps_rollup").read_text()
    pss_kib = next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:"))
    rss_pages = int(Path("/proc/self/statm").read_text().split()[1])
    return {"pss_mib": pss_kib / 1024, "rss_mib": rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20}
