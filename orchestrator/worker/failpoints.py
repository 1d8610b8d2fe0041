"""Failure injection for tests and game days.

ORCHESTRATOR_FAILPOINTS is a comma-separated list of `NAME[@TASK_ID]=ACTION[*K]`:

- NAME: `worker.before_spawn` (in the worker, after it took the job, before the task process
  exists), `task.before_running` (in the task process, before its "running" handshake),
  `task.after_running` (in the task process, after the handshake, before user code).
- ACTION: `kill` (SIGKILL itself), `exit:N` (exit at once with code N), `sleep:S` (sleep S seconds).
- `*K`: fire only the first K times for a given task instance, over all its tries; counted in
  Redis so the count holds across processes and machines.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import sys
import time
from dataclasses import dataclass

from django.conf import settings

log = logging.getLogger(__name__)

WORKER_BEFORE_SPAWN = "worker.before_spawn"
TASK_BEFORE_RUNNING = "task.before_running"
TASK_AFTER_RUNNING = "task.after_running"
NAMES = (WORKER_BEFORE_SPAWN, TASK_BEFORE_RUNNING, TASK_AFTER_RUNNING)

# Counters outlive a run long enough for its retries, then expire.
COUNTER_TTL_SECONDS = 7 * 24 * 3600

_ENTRY = re.compile(
    r"^(?P<name>[a-z_.]+)(?:@(?P<task_id>[A-Za-z0-9_.\-]{1,250}))?"
    r"=(?P<action>kill|exit:(?P<code>\d{1,3})|sleep:(?P<seconds>\d+(?:\.\d+)?))"
    r"(?:\*(?P<limit>\d+))?$"
)


class FailpointError(ValueError):
    """ORCHESTRATOR_FAILPOINTS cannot be parsed."""


@dataclass(frozen=True)
class Failpoint:
    name: str
    task_id: str | None
    action: str  # "kill" | "exit" | "sleep"
    argument: float | None  # the exit code or the seconds
    limit: int | None  # fire only the first `limit` times per task instance

    def matches(self, name: str, task_id: str) -> bool:
        return self.name == name and (self.task_id is None or self.task_id == task_id)

    def counter_key(self, task_instance_id: int) -> str:
        scope = f"@{self.task_id}" if self.task_id else ""
        return f"orchestrator:failpoint:{self.name}{scope}:{task_instance_id}"


def parse(spec: str) -> list[Failpoint]:
    """Parse a failpoint list; a bad entry raises FailpointError naming it."""
    failpoints = []
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        match = _ENTRY.match(entry)
        if match is None:
            raise FailpointError(
                f"ORCHESTRATOR_FAILPOINTS: cannot parse {entry!r}; expected NAME[@TASK_ID]=kill|exit:N|sleep:S[*K]"
            )
        if match["name"] not in NAMES:
            raise FailpointError(
                f"ORCHESTRATOR_FAILPOINTS: unknown failpoint {match['name']!r} in {entry!r}; known: {', '.join(NAMES)}"
            )
        action = match["action"].split(":")[0]
        argument = float(match["code"]) if match["code"] else float(match["seconds"]) if match["seconds"] else None
        if action == "exit" and not 0 <= int(match["code"]) <= 255:
            raise FailpointError(f"ORCHESTRATOR_FAILPOINTS: exit code must be 0-255 in {entry!r}")
        limit = int(match["limit"]) if match["limit"] is not None else None
        failpoints.append(Failpoint(match["name"], match["task_id"], action, argument, limit))
    return failpoints


def configured() -> list[Failpoint]:
    return parse(settings.ORCHESTRATOR_FAILPOINTS or "")


def in_task_process(task_id: str) -> bool:
    """Whether a failpoint is set to fire in this task's own process (so it must have one that
    runs Python before the task: a bash command is then not started directly)."""
    return any(fp.matches(TASK_BEFORE_RUNNING, task_id) or fp.matches(TASK_AFTER_RUNNING, task_id) for fp in configured())


def fire(name: str, *, task_instance_id: int, task_id: str) -> None:
    """Act on every configured failpoint `name` that matches this task and has not run out."""
    for failpoint in configured():
        if not failpoint.matches(name, task_id):
            continue
        if failpoint.limit is not None and _count(failpoint, task_instance_id) > failpoint.limit:
            continue
        _act(failpoint, task_instance_id, task_id)


def _count(failpoint: Failpoint, task_instance_id: int) -> int:
    from orchestrator.foundation.redis_conn import get_redis

    key = failpoint.counter_key(task_instance_id)
    pipe = get_redis().pipeline()
    pipe.incr(key)
    pipe.expire(key, COUNTER_TTL_SECONDS)
    return int(pipe.execute()[0])


def _act(failpoint: Failpoint, task_instance_id: int, task_id: str) -> None:
    log.warning(
        "failpoint %s fired for task %s (instance %s) in pid %s: %s%s",
        failpoint.name,
        task_id,
        task_instance_id,
        os.getpid(),
        failpoint.action,
        "" if failpoint.argument is None else f":{failpoint.argument:g}",
    )
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if failpoint.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # SIGKILL is delivered at once; never go on meanwhile
    elif failpoint.action == "exit":
        os._exit(int(failpoint.argument or 0))
    elif failpoint.action == "sleep":
        time.sleep(float(failpoint.argument or 0))
