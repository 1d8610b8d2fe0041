"""Outcomes the database could not take yet, kept on the worker's disk until it can.

When a report cannot be delivered within a few seconds (the metadata database is away), the
slot writes it here and moves on; the worker's spool thread delivers it, fenced by its attempt
token, as soon as the database answers. Until then the attempt keeps its lease (database
heartbeat, or Redis while the database is away), so no scheduler presumes the finished task lost
and runs it again. A file left by an earlier worker process on this machine is delivered too:
the token makes a late delivery harmless (a newer attempt simply wins).
"""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)


class Spool:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def put(self, record: dict[str, Any]) -> Path:
        """Keep one undelivered report, durably (written, synced, then renamed into place)."""
        name = f"ti-{record['task_instance_id']}-{record['token']}.json"
        path = self.directory / name
        draft = path.with_name(f".{name}.{os.getpid()}.{threading.get_ident()}")
        with open(draft, "w") as f:
            json.dump(record, f, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(draft, path)
        return path

    def pending(self) -> list[tuple[Path, dict[str, Any]]]:
        records = []
        for path in sorted(self.directory.glob("ti-*.json")):
            try:
                records.append((path, json.loads(path.read_text())))
            except (OSError, ValueError):
                log.error("unreadable spooled report %s; left in place", path)
        return records

    def drain(self, deliver: Callable[[dict[str, Any]], bool]) -> int:
        """Try to deliver every spooled report; `deliver` returns True when the database took it
        (or refused it as stale) and raises while the database is unreachable."""
        delivered = 0
        for path, record in self.pending():
            try:
                done = deliver(record)
            except Exception:
                log.warning("spooled report %s still waits for the database", path.name)
                return delivered
            if done:
                path.unlink(missing_ok=True)
                delivered += 1
        return delivered
