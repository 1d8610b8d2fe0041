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

Every file the worker spools (a report, `ti-*.json`, and a running attempt's task state
changes, `state-ti-*.json`) is sealed: its JSON object's first member is `"mac"`, an HMAC-SHA256
of the rest of the file's exact text (and of what kind of file it is), keyed from the worker's
SECRET_KEY with a purpose of its own (`seal`). No task process has that key (its fork server and
it get a throwaway one), so a task that writes a file into the spool cannot make one the worker
takes. A file whose seal does not verify (none, a wrong one, made with another key, unreadable,
not JSON, not a regular file) was not made by this platform: it is never delivered, and changes
nothing; it is set aside, logged as such, counted in `orchestrator_spool_files_refused_total` and
listed for the workers page. Files written before the spool was sealed are refused the same way,
as are files sealed with a key the worker no longer has (SECRET_KEY_FALLBACKS are still tried).
The spool's directories are the worker's alone (0700, its files 0600), but only the seal is relied on.
"""
from __future__ import annotations

import fcntl
import hmac
import json
import logging
import os
import re
import stat
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
# What a spooled file's seal is computed for: one key of its own per kind of file, derived
# from SECRET_KEY, so that neither a key used elsewhere nor another kind of file passes.
SEAL_PURPOSE = "orchestrator.worker.spool"
REPORT = "report"
TASK_STATE = "task_state"
_SEAL_PREFIX = '{"mac":"'
_SEAL_HEX = 64  # SHA-256
_HEX = re.compile(f"[0-9a-f]{{{_SEAL_HEX}}}")
# Far above any report a worker writes (a result, two output captures, task state changes): a
# larger file is not read at all.
MAX_FILE_BYTES = 256 * 1024 * 1024
# How a refused file is described: the words an operator greps for.
NOT_OURS = "not made by this platform"
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


class NotOurs(Exception):
    """A spooled file this platform did not make (or cannot read): why."""


def seal(text: str, kind: str = REPORT, secret: str | None = None) -> str:
    """JSON text of an object, sealed: the same object with `"mac"` as its first member, the
    HMAC of `text` as it is (by a key derived from `secret`, default SECRET_KEY, for `kind`)."""
    if not text.startswith("{"):
        raise ValueError("only a JSON object is spooled")
    rest = text[1:]
    return f'{_SEAL_PREFIX}{_mac(text, kind, secret)}"' + (rest if rest == "}" else "," + rest)


def unsealed(text: str, kind: str = REPORT, secrets: list[str] | None = None) -> dict[str, Any]:
    """The object a sealed text holds, once its seal verified under one of `secrets` (default
    SECRET_KEY and its fallbacks); NotOurs saying why otherwise."""
    end = len(_SEAL_PREFIX) + _SEAL_HEX
    mac = text[len(_SEAL_PREFIX) : end]
    if not text.startswith(_SEAL_PREFIX) or not _HEX.fullmatch(mac) or text[end : end + 1] != '"':
        raise NotOurs("no seal")
    after = text[end + 1 :]
    if after.startswith(","):
        body = "{" + after[1:]
    elif after.startswith("}"):
        body = "{" + after
    else:
        raise NotOurs("no seal")
    if not any(hmac.compare_digest(mac, _mac(body, kind, secret)) for secret in (secrets or _secrets())):
        raise NotOurs("its seal does not verify")
    try:
        record = json.loads(body)
    except (ValueError, RecursionError):  # sealed, so ours: but never trust a parser's recursion
        raise NotOurs("sealed, but not JSON") from None
    if not isinstance(record, dict):
        raise NotOurs("sealed, but not a JSON object")
    return record


def _mac(text: str, kind: str, secret: str | None) -> str:
    from django.utils.crypto import salted_hmac

    # salted_hmac derives the key from the salt and the secret (SHA-256 of both), then HMACs.
    return salted_hmac(f"{SEAL_PURPOSE}.{kind}", text, secret=secret, algorithm="sha256").hexdigest()


def _secrets() -> list[str]:
    from django.conf import settings

    return [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]


class Spool:
    def __init__(self, root: Path, worker_name: str = "worker", secret: str | None = None) -> None:
        self.root = Path(root)
        self.worker_name = worker_name
        self.directory = self.root / namespace_of(worker_name)
        self.aside = self.root / SET_ASIDE_DIR
        # Read once: the key of the files this worker writes, and the keys it takes files under.
        self._secret = secret if secret is not None else _secrets()[0]
        self._secrets = [secret] if secret is not None else _secrets()
        _private_directory(self.root)
        _private_directory(self.directory)
        # Held until this process ends (the kernel lets go of it then, however it ends).
        self._lock = os.fdopen(_open_private(self.directory / LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a")
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
        return _write_durably(self.directory / name, self.sealed(record))

    def sealed(self, record: dict[str, Any], kind: str = REPORT) -> str:
        """A record as this worker spools it: JSON text with its seal."""
        return seal(json.dumps(record, default=str), kind, self._secret)

    def keep_changes(self, task_instance_id: int, token: int, changes: list[dict[str, Any]]) -> None:
        """Keep a running attempt's task state changes that the database could not take, durably,
        until its outcome (which carries them) is delivered or spooled; [] forgets them."""
        path = self.directory / f"state-ti-{task_instance_id}-{token}.json"
        if not changes:
            path.unlink(missing_ok=True)
            return
        _write_durably(path, self.sealed({"task_instance_id": task_instance_id, "token": token, "changes": changes}, TASK_STATE))

    def pending(self) -> list[tuple[Path, dict[str, Any] | NotOurs]]:
        """This worker's reports (and those it adopted), oldest first; for a file whose seal does
        not verify (or that cannot be read), why it is not taken."""
        self._adopt_orphans()
        records: list[tuple[Path, dict[str, Any] | NotOurs]] = []
        for path in sorted(self.directory.glob("ti-*.json"), key=_mtime):
            try:
                records.append((path, unsealed(_read_bounded(path), REPORT, self._secrets)))
            except FileNotFoundError:
                continue
            except NotOurs as exc:
                records.append((path, exc))
            except (OSError, UnicodeDecodeError) as exc:
                records.append((path, NotOurs(f"unreadable: {type(exc).__name__}")))
        return records

    def drain(self, deliver: Callable[[dict[str, Any]], bool]) -> int:
        """Try to deliver every spooled report; `deliver` returns True when the database took it
        (or refused it as stale) and raises while the database is unreachable, which stops the
        drain; `Retry` keeps that one file for the next drain. Any other error sets that one
        file aside and the drain goes on."""
        delivered = 0
        for path, record in self.pending():
            if isinstance(record, NotOurs):
                try:
                    self.refuse_file(path, str(record))
                except OSError:  # gone meanwhile, or cannot be moved: never in the way of the rest
                    log.warning("could not set aside the spooled file %s, %s", path.name, NOT_OURS, exc_info=True)
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
                self.set_aside_file(path, f"{type(exc).__name__}: {exc}", record)
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

    def set_aside_file(self, path: Path, reason: str, record: dict[str, Any]) -> Path:
        """Move a spooled report (its seal verified: `record` is what it holds) out of the way."""
        target = self._aside_path(path.name)
        _write_durably(_reason_file(target), reason + "\n")
        os.replace(path, target)
        return self._noted(target, reason, record)

    def refuse_file(self, path: Path, why: str) -> Path:
        """A file in the spool that this platform did not make: never delivered, nothing of it
        read or believed (not even the ids in its name), set aside with why, counted, logged."""
        reason = f"{NOT_OURS}: {why}"
        target = self._aside_path(path.name)
        _write_durably(_reason_file(target), reason + "\n")
        os.replace(path, target)
        log.warning("spooled file %s was %s (%s): set aside as %s, not delivered", path.name, NOT_OURS, why, target.name)
        from orchestrator.data import metrics

        metrics.increment(metrics.SPOOL_FILES_REFUSED, worker_name=self.worker_name)
        return self._noted(target, reason, {}, counted=False)

    def _aside_path(self, name: str) -> Path:
        """Where a file is set aside: under its own name, unless that would replace another."""
        _private_directory(self.aside)
        return _unused(self.aside / name)

    def _noted(self, path: Path, reason: str, record: dict[str, Any], counted: bool = True) -> Path:
        note_set_aside(
            {
                "file": str(path),
                "reason": reason[:1000],
                "worker_name": self.worker_name,
                "task_instance_id": record.get("task_instance_id"),
                "token": record.get("token"),
                "at": time.time(),
            },
            counted=counted,
        )
        return path

    def _adopt_orphans(self) -> None:
        """Move the files of ended workers (directories nobody holds locked, or the files of the
        older layout, straight in the root) into this worker's directory. Nothing in them is
        read here: each is taken only if its seal verifies (`pending`)."""
        for path in self.root.glob("ti-*.json"):
            os.replace(path, _unused(self.directory / path.name))
        for other in self.root.iterdir():
            if other.is_symlink() or not other.is_dir() or other in (self.directory, self.aside):
                continue
            try:
                with os.fdopen(_open_private(other / LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a") as lock:
                    try:
                        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue  # a live worker's
                    for path in other.glob("ti-*.json"):
                        os.replace(path, _unused(self.directory / path.name))
                        log.info("adopted the spooled report %s of ended worker %s", path.name, other.name)
                    for path in other.glob("state-ti-*.json"):
                        path.unlink(missing_ok=True)  # its attempts were superseded: fenced out anyway
                    (other / LOCK_FILE).unlink(missing_ok=True)
                    _remove_if_empty(other)
            except OSError:
                continue


def note_set_aside(entry: dict[str, Any], counted: bool = True) -> None:
    """Count the set-aside report (unless it was counted as refused) and list it for the
    workers page; Redis being away only loses the note."""
    from orchestrator.data import metrics
    from orchestrator.foundation.redis_conn import get_redis

    if counted:
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
    from orchestrator.foundation.redis_conn import get_redis

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
    _private_directory(path.parent)
    draft = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        fd = _open_private(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:  # left by a process that died writing it (or put there): not ours
        draft.unlink()
        fd = _open_private(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(draft, path)
    return path


def _unused(path: Path) -> Path:
    """`path`, or if a file (or its reason) is there already, the same name numbered: a file
    moved in never replaces one that is there (a forged report, a spooled one of the same
    attempt), and still matches `ti-*.json`."""
    candidate, number = path, 1
    while candidate.exists() or candidate.is_symlink() or _reason_file(candidate).exists():
        candidate = path.with_name(f"{path.stem}.{number}{path.suffix}")
        number += 1
    return candidate


def _private_directory(path: Path) -> None:
    """A directory only the worker's user may enter (0700, whatever the umask)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    try:
        os.chmod(path, 0o700)
    except PermissionError:  # not ours to change (made by someone else): the seals still hold
        log.warning("the spool directory %s is not the worker's own: its mode stays as it is", path)


def _open_private(path: Path, flags: int) -> int:
    """Open a file of the spool as only the worker's user may read it (0600), never through a
    symbolic link."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd


def _read_bounded(path: Path) -> str:
    """A spooled file's text: only a regular file (no link, no FIFO to block on), at most
    MAX_FILE_BYTES; OSError or NotOurs otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotOurs("not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise NotOurs(f"{info.st_size} bytes, over {MAX_FILE_BYTES}")
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise NotOurs(f"over {MAX_FILE_BYTES} bytes")
    return data.decode("utf-8")


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
