"""The user every task process runs as (ORCHESTRATOR_TASK_USER), and each attempt's own directory.

A task is a guest: with a task user, the worker (root) hands each task process that user's uid
and primary gid with no supplementary groups, so the task can neither signal nor trace the
worker or its fork server, nor read their memory, environment or files (the spool, the files
set aside, the kept output: all the worker's, mode 0700). Each attempt gets a directory of its
own, mode 0700 and owned by the task user, as its `HOME`, `TMPDIR` and working directory; it
is removed when the worker is done with the attempt's process group.

Without a task user, tasks run as the worker's user, in the worker's working directory: see
docs/operations.md for which protections hold then.
"""
from __future__ import annotations

import logging
import os
import pwd
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# Each worker's attempt directories live in one directory of its own: its owner's (root's),
# mode 0711, so a task may enter its own attempt's directory but list none.
HOMES_PREFIX = "orchestrator-attempts-"


class TaskUserError(Exception):
    """The worker cannot run its tasks as the task user: it must not start."""


@dataclass(frozen=True)
class TaskUser:
    name: str
    uid: int
    gid: int


def resolve(setting: str, *, euid: int | None = None) -> TaskUser | None:
    """The task user a setting names (a user name or a uid), or None when unset. Raises
    TaskUserError, saying why, when there is no such user or this process cannot switch to it."""
    setting = setting.strip()
    if not setting:
        return None
    try:
        entry = pwd.getpwuid(int(setting)) if setting.isdigit() else pwd.getpwnam(setting)
    except (KeyError, OverflowError):
        raise TaskUserError(f"ORCHESTRATOR_TASK_USER={setting!r}: no such user on this machine") from None
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        raise TaskUserError(
            f"ORCHESTRATOR_TASK_USER={setting!r}: the worker runs as uid {euid}, not root, and so cannot run tasks as "
            f"{entry.pw_name} (uid {entry.pw_uid}); start the worker as root (with CAP_SETUID, CAP_SETGID, CAP_KILL, "
            "CAP_CHOWN, CAP_FOWNER and CAP_DAC_OVERRIDE) or unset the setting"
        )
    if entry.pw_uid == 0:
        raise TaskUserError(f"ORCHESTRATOR_TASK_USER={setting!r} is root: tasks running as root are not kept from anything")
    return TaskUser(entry.pw_name, entry.pw_uid, entry.pw_gid)


def describe(user: TaskUser | None) -> str | None:
    """The task user as the workers page and the API show it."""
    return user.name if user is not None else None


class AttemptHomes:
    """Makes and removes the attempts' private directories of one worker."""

    def __init__(self, user: TaskUser, parent: str | None = None) -> None:
        self.user = user
        self.root = Path(tempfile.mkdtemp(prefix=HOMES_PREFIX, dir=parent))
        os.chmod(self.root, 0o711)

    def make(self) -> str:
        """A new directory for one attempt: owned by the task user, mode 0700, a name no other
        attempt can guess (nobody but root can list the root)."""
        path = self.root / secrets.token_hex(16)
        path.mkdir(mode=0o700)
        os.chown(path, self.user.uid, self.user.gid)
        os.chmod(path, 0o700)
        return str(path)

    def remove(self, path: str) -> None:
        """Remove an attempt's directory and all the task left in it (without following any
        link the task made: `shutil.rmtree` works on directory descriptors)."""
        if Path(path).parent != self.root:
            return
        shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
