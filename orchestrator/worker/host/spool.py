"""Outcomes the database could not take yet, kept on the worker's disk until it can.

When a report cannot be delivered within a few seconds (the metadata database is away), the
slot writes it here and moves on; the worker's spool thread delivers it, fenced by its attempt
token, as soon as the database answers. Until then the attempt keeps its lease (database
heartbeat, or Redis while the database is away), so no scheduler presumes the finished task lost
and runs it again.

Each worker writes in a directory of its own under ORCHESTRATOR_SPOOL_DIR (its name), locked
(`flock`) for as long as it lives: the workers of one checkout share the root, but each delivers
only its own reports, and so lets go only of its own leases. A directory whose lock nobody holds
is an ended worker's: the next worker to look adopts its files (the token makes a late delivery
harmless; a newer attempt simply wins).

A file the database refuses for any reason but a lost connection (or that cannot be read) is
set aside (`set-aside/`, with a `.reason` file beside it), counted in
`orchestrator_spool_set_aside_total` and listed for the workers page; the files behind it are
delivered all the same. So is one whose deliveries fail, again and again, with the same error
that may pass but has not (a statement timeout, a deadlock, SQLite's "database is locked"):
`Streaks` says when it has lasted ORCHESTRATOR_SPOOL_REPEATED_ERROR_TOLERANCE; until then the
file waits (`Retry`) and the files behind it are tried.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from django.db import InterfaceError, OperationalError

log = logging.getLogger(__name__)

SET_ASIDE_DIR = "set-aside"
LOCK_FILE = ".lock"
# The newest set-aside reports, for the workers page (a Redis list, newest first).
SET_ASIDE_KEY = "orchestrator:spool:set_aside"
SET_ASIDE_SHOWN = 100
# A report is taken as refused after this many deliveries at least (and the tolerance's seconds)
# failed with the same error: one slow delivery followed by a long wait is no repetition.
REPEATED_DELIVERIES = 3


class Retry(Exception):
    """This report waits for the next drain (its delivery failed with an error that may pass);
    the reports behind it are tried now."""


@dataclass
class _Streak:
    error: str
    since: float
    deliveries: int = 1


class Streaks:
    """How long each spooled report's deliveries have failed with one same error that is no
    lost connection: a lease must not be kept for ever for a report no database will take."""

    def __init__(self) -> None:
        self._streaks: dict[tuple[int, int], _Streak] = {}

    def failed(self, attempt: tuple[int, int], error: str, tolerance: float, now: float | None = None) -> bool:
        """One more delivery of `attempt` failed with `error`; True once deliveries have failed
        with it for `tolerance` seconds and REPEATED_DELIVERIES times at least."""
        now = time.monotonic() if now is None else now
        streak = self._streaks.get(attempt)
        if streak is None or streak.error != error:
            streak = self._streaks[attempt] = _Streak(error, now, 0)
        streak.deliveries += 1
        return streak.deliveries >= REPEATED_DELIVERIES and now - streak.since >= tolerance

    def clear(self, attempt: tuple[int, int]) -> None:
        self._streaks.pop(attempt, None)


def namespace_of(worker_name: str) -> str:
    """A worker's name as a directory name."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", worker_name) or "worker"


class Spool:
    def __init__(self, root: Path, worker_name: str = "worker") -> None:
        self.root = Path(root)
        self.worker_name = worker_name
        self.directory = self.root / namespace_of(worker_name)
        self.aside = self.root / SET_ASIDE_DIR
        self.directory.mkdir(parents=True, exist_ok=True)
        # Held until this process ends (the kernel lets go of it then, however it ends).
        self._lock = open(self.directory / LOCK_FILE, "a")  # noqa: SIM115 -- held open for the life of the process
        try:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise RuntimeError(f"another live worker already spools in {self.directory}") from None
        self.streaks = Streaks()  # of the spool thread's deliveries

    def close(self) -> None:
        self._lock.close()

    def put(self, record: dict[str, Any]) -> Path:
        """Keep one undelivered report, durably (written, synced, then renamed into place)."""
        name = f"ti-{record['task_instance_id']}-{record['token']}.json"
        return _write_durably(self.directory / name, json.dumps(record, default=str))

    def keep_changes(self, task_instance_id: int, token: int, changes: list[dict[str, Any]]) -> None:
        """Keep a running attempt's task state changes that the database could not take, durably,
        until its outcome (which carries them) is delivered or spooled; [] forgets them."""
        path = self.directory / f"state-ti-{task_instance_id}-{token}.json"
        if not changes:
            path.unlink(missing_ok=True)
            return
        _write_durably(path, json.dumps({"task_instance_id": task_instance_id, "token": token, "changes": changes}, default=str))

    def pending(self) -> list[tuple[Path, dict[str, Any] | None]]:
        """This worker's reports (and those it adopted), oldest first; None for an unreadable one."""
        self._adopt_orphans()
        records: list[tuple[Path, dict[str, Any] | None]] = []
        for path in sorted(self.directory.glob("ti-*.json"), key=_mtime):
            try:
                records.append((path, json.loads(path.read_text())))
            except FileNotFoundError:
                continue
            except (OSError, ValueError):
                records.append((path, None))
        return records

    def drain(self, deliver: Callable[[dict[str, Any]], bool]) -> int:
        """Try to deliver every spooled report; `deliver` returns True when the database took it
        (or refused it as stale) and raises while the database is unreachable, which stops the
        drain; `Retry` keeps that one file for the next drain. Any other error sets that one
        file aside and the drain goes on."""
        delivered = 0
        for path, record in self.pending():
            if record is None:
                self.set_aside_file(path, "unreadable: not a JSON report")
                continue
            try:
                done = deliver(record)
            except (OperationalError, InterfaceError):
                log.warning("spooled report %s still waits for the database", path.name)
                return delivered
            except Retry as exc:
                log.warning("spooled report %s waits for the next try: %s", path.name, exc)
                continue
            except Exception as exc:
                log.exception("spooled report %s was refused; set aside", path.name)
                self.set_aside_file(path, f"{type(exc).__name__}: {exc}")
                continue
            if done:
                path.unlink(missing_ok=True)
                delivered += 1
        return delivered

    def set_aside(self, record: dict[str, Any], reason: str) -> Path:
        """Keep a report no database will take, with why, out of the way of the others."""
        name = f"ti-{record.get('task_instance_id')}-{record.get('token')}.json"
        path = self.aside / name
        # The reason lands first: whoever sees the report set aside can read why.
        _write_durably(_reason_file(path), reason + "\n")
        _write_durably(path, json.dumps(record, default=str))
        return self._noted(path, reason, record)

    def set_aside_file(self, path: Path, reason: str) -> Path:
        self.aside.mkdir(parents=True, exist_ok=True)
        target = self.aside / path.name
        _write_durably(_reason_file(target), reason + "\n")
        os.replace(path, target)
        try:
            record = json.loads(target.read_text())
        except (OSError, ValueError):
            record = {}
        return self._noted(target, reason, record if isinstance(record, dict) else {})

    def _noted(self, path: Path, reason: str, record: dict[str, Any]) -> Path:
        note_set_aside(
            {
                "file": str(path),
                "reason": reason[:1000],
                "worker_name": self.worker_name,
                "task_instance_id": record.get("task_instance_id"),
                "token": record.get("token"),
                "at": time.time(),
            }
        )
        return path

    def _adopt_orphans(self) -> None:
        """Move the files of ended workers (directories nobody holds locked, or the files of the
        older layout, straight in the root) into this worker's directory."""
        for path in self.root.glob("ti-*.json"):
            os.replace(path, self.directory / path.name)
        for other in self.root.iterdir():
            if not other.is_dir() or other in (self.directory, self.aside):
                continue
            try:
                with open(other / LOCK_FILE, "a") as lock:
                    try:
                        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue  # a live worker's
                    for path in other.glob("ti-*.json"):
                        os.replace(path, self.directory / path.name)
                        log.info("adopted the spooled report %s of ended worker %s", path.name, other.name)
                    for path in other.glob("state-ti-*.json"):
                        path.unlink(missing_ok=True)  # its attempts were superseded: fenced out anyway
                    (other / LOCK_FILE).unlink(missing_ok=True)
                    _remove_if_empty(other)
            except OSError:
                continue


def note_set_aside(entry: dict[str, Any]) -> None:
    """Count the set-aside report and list it for the workers page; Redis being away only loses the note."""
    from orchestrator import metrics
    from orchestrator.redis_conn import get_redis

    metrics.increment(metrics.SPOOL_SET_ASIDE, worker_name=str(entry.get("worker_name")))
    try:
        redis = get_redis()
        with redis.pipeline() as pipe:
            pipe.lpush(SET_ASIDE_KEY, json.dumps(entry, default=str))
            pipe.ltrim(SET_ASIDE_KEY, 0, SET_ASIDE_SHOWN - 1)
            pipe.execute()
    except Exception:
        log.warning("could not list the set-aside report %s", entry.get("file"), exc_info=True)


def set_aside_entries() -> list[dict[str, Any]]:
    """The newest set-aside reports, newest first (for the workers page)."""
    from orchestrator.redis_conn import get_redis

    entries = []
    # redis-py types a reply as maybe-awaitable, for its async client too.
    shown = cast("list[bytes]", get_redis().lrange(SET_ASIDE_KEY, 0, SET_ASIDE_SHOWN - 1))
    for raw in shown:
        try:
            entries.append(json.loads(raw))
        except ValueError:
            continue
    return entries


def _reason_file(report: Path) -> Path:
    return report.with_name(report.name + ".reason")


def _write_durably(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    with open(draft, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(draft, path)
    return path


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        pass  # a draft being written, or a worker of that name just started: leave it


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
