"""Each attempt in a Landlock domain of its own: it signals and traces only its own processes.

All attempts run as one task user, and the kernel lets a process signal any other of its user,
and trace one that is dumpable (a bash task's processes are). A task process that restricts
itself with a Landlock ruleset scoping signals (Linux 6.12, Landlock ABI 6) can afterwards
signal only processes of its own domain (itself and what it starts), and, as Landlock does for
every domain, trace (or read the `/proc/PID/environ` and `mem` of) only those: not the worker,
not its fork server, not another attempt, whatever their user. Nothing else is restricted: the
ruleset handles no file or network access.

The task process restricts itself after its fork and before it becomes the task user, while it
still holds the fork server's privileges (Landlock then needs no `no_new_privs`, so a set-user-ID
program a task runs keeps working as it would for that user).
"""
from __future__ import annotations

import ctypes
import functools
import os
import platform

# The Landlock system calls have one number on every architecture Linux gives them to.
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
LANDLOCK_SCOPE_SIGNAL = 1 << 1
SIGNAL_SCOPE_ABI = 6  # the first ABI that scopes signals


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (not Linux, not built in, not
    enabled at boot)."""
    if platform.system() != "Linux":
        return 0
    version = _libc().syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, int(version))


def available() -> bool:
    """Whether an attempt can be confined here: Landlock with signal scoping."""
    return abi() >= SIGNAL_SCOPE_ABI


def works() -> bool:
    """Whether an attempt can be confined here, tried for real in a throwaway child: a kernel
    may report an ABI and still refuse the restriction (a container's seccomp profile), and a
    fork server that believed it would fail every task user's attempt at its start."""
    if not available():
        return False
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's exit status is the answer
        try:
            confine()
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def confine() -> None:
    """Put this process (and everything it starts from now on) in a new Landlock domain that
    scopes signals. Raises OSError when the kernel refuses: the caller must not run the task."""
    libc = _libc()
    attr = _RulesetAttr(0, 0, LANDLOCK_SCOPE_SIGNAL)
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"landlock_create_ruleset: {os.strerror(code)}")
    try:
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"landlock_restrict_self: {os.strerror(code)}")
    finally:
        os.close(ruleset)
