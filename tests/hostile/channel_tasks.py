"""Hostile tasks against the worker's channel and spool: each writes what a task must not be
able to pass off as the platform's."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

# Larger than ORCHESTRATOR_RESULT_MAX_BYTES (65536) plus the channel's margin.
OVERSIZED_BYTES = 512 * 1024

LINES = {
    "garbage": b"\x00\x9f\x92\x96 \x07garbage\xc3\x28\n",
    "invalid_utf8": b'{"type": "success", "result": "caf\xe9 \xff\xfe"}\n',
    "not_json": b"this is not JSON at all\n",
    "not_an_object": b'["success", {"iban": "ATTACKER"}]\n',
    "oversized": b'{"type": "success", "result": "' + b"x" * OVERSIZED_BYTES + b'"}\n',
    "deep": b'{"type": "success", "result": ' + b"[" * 5000 + b"]" * 5000 + b"}\n",
    "not_a_task_message": b'{"type": "bash_exit", "exit_code": "not a number"}\n',
    "bad_retry_after": b'{"type": "failure", "exception": {"exception_type": "X", "retry_after": "soon"}}\n',
}


def message_fd() -> int:
    """The channel to the worker, found as any task could: the one socket this process holds."""
    for name in sorted(os.listdir("/proc/self/fd"), key=int):
        fd = int(name)
        if fd <= 2:
            continue
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            return fd
    raise RuntimeError("no channel to the worker found")


def descriptors() -> dict[str, str]:
    """The descriptors this task process holds (but the one its listing opens), with what each is."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[name] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own, closed by now
    return found


def write_on_channel(kind: str) -> str:
    """Write one hostile line straight on the channel, then carry on as if nothing happened."""
    fd = message_fd()
    data = LINES[kind]
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass  # the worker stopped reading
    time.sleep(0.5)
    return "carried on"


def leave_a_line_unfinished() -> None:
    """Half a message, then an exit of its own with status 0 and no outcome."""
    os.write(message_fd(), b'{"type": "success", "result": {"iban": "ATTA')
    os._exit(0)


def return_nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


def forge_spool_files(spool: str, victims: dict[str, list[int]]) -> dict[str, str]:
    """Write a report for each victim attempt (`{"root"|"own"|"ended": [ti, token]}`) claiming
    its success with the attacker's account: in the spool's root (no seal), in this task's own
    worker's directory (a made-up seal) and in an ended worker's directory (sealed with the only
    key a task has, its own throwaway SECRET_KEY)."""
    from orchestrator.worker.host.spool import seal

    root = Path(spool)
    written = {}
    for where, (ti, token) in victims.items():
        report = {"task_instance_id": ti, "token": token, "success": True, "ended_at": "2026-01-01T00:00:00+00:00",
                  "output": {"stdout": "", "stderr": "", "output_truncated": False}, "result": {"iban": "ATTACKER"}}  # fmt: skip
        text = json.dumps(report)
        name = f"ti-{ti}-{token}.json"
        if where == "root":
            path = root / name
        elif where == "own":
            (own,) = [d for d in root.iterdir() if d.is_dir() and d.name != "set-aside" and (d / ".lock").exists()]
            path, text = own / name, '{"mac":"' + "0" * 64 + '",' + text[1:]
        else:
            (root / "gone.7").mkdir(exist_ok=True)
            path, text = root / "gone.7" / name, seal(text)
        path.write_text(text)
        written[where] = str(path)
    return written
