"""The worker's fork server: a warm process that forks one task process per attempt.

    python -m orchestrator.worker.forkserver SOCKET_FD

It imports the task runner and the modules named in ORCHESTRATOR_PRELOAD_MODULES once (Django's
apps only if one of them needs them), then serves requests on a SOCK_SEQPACKET socket from its
worker: each `spawn` carries the attempt's pipes (SCM_RIGHTS) and the task's environment, and
gets back the new pid. A forked child starts warm (no interpreter start-up, nothing to import),
in its own session and process group, holding only the descriptors it was sent.

It is also the worker's watchdog and reaper:
- it is every task process's parent, so it learns each exit status (reported to the worker as
  `exited`); orphans of a task's group go to the worker, a child subreaper, which reaps them;
- a task process's zombie is kept until the worker sends `release`, so the pid, and so the
  process group id the worker signals, cannot be reused while the worker may still signal it;
- it runs in a session of its own, so a kill of the worker's process group does not take it:
  when the worker dies, however it dies, the socket reaches end-of-file and it SIGKILLs every
  task group it started before it exits. Each task process also dies with it (PR_SET_PDEATHSIG);
- it holds the worker's lease: each heartbeat that got through (to the database, or to Redis)
  sends `alive` for a little less than the heartbeat timeout. A worker that stops sending (it
  was SIGSTOPped, or cut off from both) has its task groups SIGKILLed here when that runs out,
  before any scheduler can presume them lost, since the worker itself cannot act.

A spawn that names a command (a bash task whose handshake the supervisor has already recorded)
starts that command itself with `posix_spawn`, through `setpriv --pdeathsig KILL`: no copy of
this process, no Python in between, the same session, descriptors and death signal.

It never opens a database or Redis connection, so no child can inherit one.
"""
from __future__ import annotations

import gc
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.worker.forkserver import codecache, confinement

MAX_MESSAGE = 1 << 20  # a spawn request: the task's environment, well under a megabyte
FDS_PER_SPAWN = 3  # stdout, stderr, the channel (a socket: the supervisor's messages and the task's)
# How long after a spawn the next spare is forked, if no other spawn came meanwhile.
SPARE_DELAY = 0.005
# How long a spare waits for an attempt before it is let go: an idle worker keeps no task
# process (`ps` would count it as a copy of the fork server), and the first task after a pause
# is forked at once, then the next is forked ahead again. The worker may say otherwise.
SPARE_IDLE_SECONDS = 5.0
# How often a task module's file is looked at again for an edit (a stat, and a find through the
# import path). A task process never runs stale code: it checks the source it reads itself.
RECOMPILE_CHECK_SECONDS = 1.0


def preload(modules: list[str]) -> None:
    """Import what every task would otherwise import itself.

    Django's apps are not loaded here: a task that uses them loads them in its own process
    (`lazyapps.on_demand`), and every other fork copies a process of some 25 MiB instead of 55.
    A preloaded module that imports models loads them here, once, for every task. Settings
    are read now, from the worker's environment: a task process's environment holds no
    platform secrets, yet its failpoints, Redis and database are the worker's. No connection
    is ever opened here.
    """
    from orchestrator.worker.forkserver import lazyapps

    lazyapps.on_demand()
    from django.conf import settings

    import orchestrator.worker.failpoints

    if settings.ORCHESTRATOR_FAILPOINTS:
        # A failpoint's count is kept in Redis; without failpoints no task process needs Redis,
        # and every fork would copy the page tables of its 4 MiB.
        import orchestrator.foundation.redis_conn
    import orchestrator.worker.task.runner  # noqa: F401  the runner itself
    import retries.context  # noqa: F401  what a stopped task's on_kill hears

    for name in modules:
        threads, sockets = _thread_count(), _sockets()
        try:
            __import__(name)
        except Exception as exc:  # a bad preload must not stop the worker; the task will say why
            print(f"fork server: could not preload {name!r}: {type(exc).__name__}: {exc}", file=sys.stderr)
        # A fork copies no thread but the one that forks, and shares every socket with every
        # task process: a module that starts either cannot be loaded once for all tasks.
        if _thread_count() > threads:
            raise PreloadRefused(f"ORCHESTRATOR_PRELOAD_MODULES: {name!r} starts a thread when imported; a task process forked from it would not have that thread. Import it in the task instead")
        if _sockets() - sockets:
            raise PreloadRefused(f"ORCHESTRATOR_PRELOAD_MODULES: {name!r} opens a socket when imported; every task process would share it. Import it in the task instead")


class PreloadRefused(Exception):
    """A preloaded module did what no module loaded once for every task may do."""


def _thread_count() -> int:
    """This process's threads, those Python does not know of included."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def _sockets() -> set[str]:
    """The sockets this process holds open (`socket:[inode]`)."""
    found = set()
    for fd in _open_fds():
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


class ForkServer:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.children: dict[int, int | None] = {}  # pid -> exit status once known (Popen convention)
        self.pidfds: dict[int, int] = {}  # pidfd -> pid, for children still running
        self.polled: set[int] = set()  # running children without a pidfd (old kernels)
        self.wakeup_read, self.wakeup_write = os.pipe()
        os.set_blocking(self.wakeup_write, False)
        os.set_blocking(self.wakeup_read, False)
        self.selector = selectors.DefaultSelector()
        self.alive_until: float | None = None  # monotonic; None until the worker first says so
        self.spare: _Spare | None = None  # the next task process, forked ahead (`fork_spare`)
        self.spare_due: float | None = None  # monotonic: when to fork the next spare
        self.spare_idle = SPARE_IDLE_SECONDS
        self.expired: set[int] = set()  # children killed because the worker's lease ran out
        self.to_compile: set[str] = set()  # callables whose modules the next fork gets compiled
        self.compiled_at: dict[str, float] = {}  # callable -> monotonic: when its files were looked at

    # --- the loop -------------------------------------------------------------------------------

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wakeup_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the loop through the pipe
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the worker's group may get a SIGTERM: not ours
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.selector.register(self.sock, selectors.EVENT_READ)
        self.selector.register(self.wakeup_read, selectors.EVENT_READ)
        while True:
            for key, _ in self.selector.select(timeout=self._wait()):
                if key.fileobj is self.sock:
                    if not self._take_request():
                        self._kill_everything()
                        return
                elif key.fileobj == self.wakeup_read:
                    self._drain_wakeups()
                    self._poll_children()
                else:
                    self._on_exit(self.pidfds.pop(key.fd), key.fd)
            self._poll_children()
            self._enforce_lease()
            self._fork_spare_when_due()
            self._let_an_idle_spare_go()

    def _take_request(self) -> bool:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_MESSAGE, FDS_PER_SPAWN)
        except (ConnectionResetError, OSError):
            return False
        if not data:
            for fd in fds:
                os.close(fd)
            return False  # the worker is gone
        request = json.loads(data)
        op = request.get("op")
        if op == "spawn":
            self._spawn(request, fds)
        elif op == "release":
            self._release(int(request["pid"]))
        elif op == "alive":
            self.alive_until = time.monotonic() + float(request["seconds"])
        elif op == "spare_idle":
            self.spare_idle = max(0.0, float(request["seconds"]))
        else:
            for fd in fds:
                os.close(fd)
        return True

    # --- steps ------------------------------------------------------------------------------------

    def _spawn(self, request: dict[str, Any], fds: list[int]) -> None:
        # The worker asks for a task process right after the database recorded its claim (a
        # heartbeat): a lease that ran out while the worker was idle and cut off must not
        # condemn the new task at birth.
        if request.get("lease"):
            renewed = time.monotonic() + float(request["lease"])
            self.alive_until = renewed if self.alive_until is None else max(self.alive_until, renewed)
        forked = not request.get("argv")
        if forked:
            self._note_callable(request.get("compile"))
        try:
            pid = self._hand_to_spare(request, fds) if forked else None
            if pid is None and forked:
                self._compile_learned()
                pid = os.fork()
            elif pid is None:
                pid = _spawn_command(request, fds)
        except (OSError, TypeError, ValueError) as exc:  # a request it cannot carry out fails alone
            for fd in fds:
                os.close(fd)
            self._send({"op": "spawn_failed", "id": request["id"], "error": f"{type(exc).__name__}: {exc}"})
            return
        if pid == 0:
            server_pid = os.getppid()
            _prepare_task_process(server_pid)
            _become_task_process(request, fds, server_pid)  # never returns
        for fd in fds:
            os.close(fd)
        self.children[pid] = None
        self._watch(pid)
        self._send({"op": "spawned", "id": request["id"], "pid": pid})
        if forked:
            # The next spare is forked a moment later, not now: now the new task process, and
            # its worker waking to the reply, want the CPU (a burst of spawns forks directly).
            self.spare_due = time.monotonic() + SPARE_DELAY

    # --- the spare: the next task process, forked ahead ---------------------------------------------

    def fork_spare(self) -> None:
        """Fork the next task process before it is asked for: a spawn then only hands it its
        descriptors and environment, and the fork (a copy of this process's page tables) and the
        child's set-up are off the way from one task to the next."""
        if self.spare is not None:
            return
        self._compile_learned()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = os.fork()
        except OSError as exc:
            ours.close()
            theirs.close()
            print(f"fork server: could not fork a spare task process: {exc}", file=sys.stderr, flush=True)
            return
        if pid == 0:
            ours.close()
            _wait_as_spare(theirs, server_pid=os.getppid())  # never returns
        theirs.close()
        self.spare = _Spare(pid, ours, since=time.monotonic())

    def _note_callable(self, callable_path: object) -> None:
        """A spawn named its task's callable: its modules are compiled before the next fork,
        unless their files were looked at less than RECOMPILE_CHECK_SECONDS ago."""
        if not isinstance(callable_path, str) or callable_path in self.to_compile:
            return
        looked = self.compiled_at.get(callable_path)
        if looked is not None and time.monotonic() - looked < RECOMPILE_CHECK_SECONDS:
            return
        if len(self.to_compile) < codecache.MAX_MODULES:
            self.to_compile.add(callable_path)

    def _compile_learned(self) -> None:
        """Compile the modules of the callables spawns named (once per version of a file), so
        that the process forked next, and every one after it, has them."""
        while self.to_compile:
            callable_path = self.to_compile.pop()
            codecache.learn(callable_path)
            self.compiled_at[callable_path] = time.monotonic()
            if len(self.compiled_at) > 4 * codecache.MAX_MODULES:
                self.compiled_at.clear()

    def _fork_spare_when_due(self) -> None:
        if self.spare_due is not None and time.monotonic() >= self.spare_due:
            self.spare_due = None
            self.fork_spare()

    def _hand_to_spare(self, request: dict[str, Any], fds: list[int]) -> int | None:
        """Give the spare this attempt; its pid, or None when there is no live spare to take it."""
        spare, self.spare = self.spare, None
        if spare is None:
            return None
        try:
            handed = {"env": request["env"], "user": request.get("user"), "cgroup": request.get("cgroup")}
            socket.send_fds(spare.sock, [json.dumps(handed).encode()], fds)
        except OSError:
            _kill_task(spare.pid)  # it died, or cannot hear: the attempt gets a fresh fork
            _reap(spare.pid)
            return None
        finally:
            spare.sock.close()
        return spare.pid

    def _let_an_idle_spare_go(self) -> None:
        if self.spare is not None and time.monotonic() - self.spare.since >= self.spare_idle:
            self._drop_spare()

    def _drop_spare(self) -> None:
        spare, self.spare = self.spare, None
        if spare is not None:
            spare.sock.close()  # end-of-file: it exits
            _kill_task(spare.pid)
            _reap(spare.pid)

    def _wait(self) -> float:
        """Sleep until the next thing to do: at most a second, never past the lease, nor past
        the time the next spare is due or the spare's idle time ends."""
        now = time.monotonic()
        wait = 1.0 if self.alive_until is None else self.alive_until - now
        if self.spare_due is not None:
            wait = min(wait, self.spare_due - now)
        if self.spare is not None:
            wait = min(wait, self.spare.since + self.spare_idle - now)
        return max(0.0, min(1.0, wait))

    def _enforce_lease(self) -> None:
        if self.alive_until is None or time.monotonic() < self.alive_until:
            return
        # Ran out: nothing may run on it any more. With no task running it is simply forgotten
        # (no busy loop on a lease in the past); the worker says "alive" again when it can.
        self.alive_until = None
        running = [pid for pid, status in self.children.items() if status is None]
        if not running:
            return
        print(f"fork server: the worker's lease ran out; killing {len(running)} task groups", file=sys.stderr, flush=True)
        for pid in running:
            self.expired.add(pid)
            _kill_task(pid)

    def _watch(self, pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.polled.add(pid)
            return
        self.pidfds[fd] = pid
        self.selector.register(fd, selectors.EVENT_READ)

    def _on_exit(self, pid: int, pidfd: int) -> None:
        self.selector.unregister(pidfd)
        os.close(pidfd)
        self._report_if_ended(pid)

    def _poll_children(self) -> None:
        """Children without a pidfd are looked at on every SIGCHLD and every second."""
        for pid in list(self.polled):
            if self._report_if_ended(pid):
                self.polled.discard(pid)

    def _report_if_ended(self, pid: int) -> bool:
        """Send the exit status of an ended task process, keeping its zombie until released."""
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
            status = -signal.SIGKILL  # gone without a trace: as good as killed
        else:
            if info is None:
                return False
            status = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        self.children[pid] = status
        self._send({"op": "exited", "pid": pid, "status": status, "lease_expired": pid in self.expired})
        self.expired.discard(pid)
        return True

    def _release(self, pid: int) -> None:
        """The worker is done with this task's group: the zombie may go now."""
        if self.children.get(pid) is None:
            return  # unknown, or still running: nothing to release yet
        _reap(pid)
        del self.children[pid]

    def _kill_everything(self) -> None:
        """The worker died: no task of it may outlive it, nor anything its tasks started."""
        self._drop_spare()
        for pid in list(self.children):
            _kill_task(pid)
        for pid in list(self.children):
            _reap(pid)

    # --- plumbing ---------------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self.sock.send(json.dumps(message).encode())
        except OSError:
            pass  # the worker is gone: the loop sees it on the next read

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self.wakeup_read, 512):
                pass
        except BlockingIOError:
            pass


def _kill_task(pid: int) -> None:
    """SIGKILL a task's group, and the task process itself: a child that has not yet called
    setsid() is not the leader of any group, so the group's kill alone would miss it."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


@dataclass
class _Spare:
    pid: int
    sock: socket.socket  # where its attempt's descriptors and environment are sent
    since: float  # monotonic: when it was forked


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _prepare_task_process(server_pid: int) -> None:
    """In a forked child, before it knows its attempt: what every task process is."""
    try:
        os.setsid()  # its own session and process group: one signal reaches all it starts
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        from orchestrator.worker.task.runner import set_parent_death_signal

        set_parent_death_signal(server_pid)
        if os.geteuid() != 0:
            # A worker that is not root (so has no task user) measures its tasks' proportional
            # set size in /proc/PID/smaps_rollup, which it may read only of a dumpable process
            # (a bash task's is, once exec'ed), from its first sample on. The fork server's
            # memory, copied here, holds nothing a task may not see; the server stays undumpable.
            from orchestrator.worker.host.procs import become_dumpable

            become_dumpable()
    except BaseException:
        import traceback

        traceback.print_exc()
        os._exit(1)


# What `ps` shows for a spare while it waits (its name becomes the fork server's again once it
# is given an attempt): it runs no task yet.
SPARE_NAME = "orch-spare"
PR_SET_NAME = 15


def _set_process_name(name: str) -> None:
    from orchestrator.worker.task.runner import LIBC  # loaded once, by the preload: not once a call

    if LIBC is not None:  # elsewhere than Linux the name is only for people reading `ps`
        LIBC.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _process_name() -> str:
    try:
        return Path("/proc/self/comm").read_text().strip()
    except OSError:
        return ""


def _wait_as_spare(sock: socket.socket, server_pid: int) -> None:
    """In a spare: get ready, then wait for an attempt (its descriptors and environment) and
    become its task process; exit if the server lets it go. Never returns."""
    name = _process_name()
    _set_process_name(SPARE_NAME)
    _prepare_task_process(server_pid)
    for fd in _open_fds():  # nothing of the server's may wait here, nor reach the task
        if fd > 2 and fd != sock.fileno():
            try:
                os.close(fd)
            except OSError:
                pass
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, FDS_PER_SPAWN)
    except OSError:
        os._exit(0)
    if not data or len(fds) != FDS_PER_SPAWN:
        os._exit(0)
    if name:
        _set_process_name(name)
    _become_task_process(json.loads(data), fds, server_pid)


def _become_task_process(request: dict[str, Any], fds: list[int], server_pid: int) -> None:
    """In the forked child, prepared (`_prepare_task_process`): become the attempt's task
    process (as the task user, when there is one). Never returns."""
    code = 1
    try:
        from orchestrator.worker.task.runner import run_forked

        stdout_fd, stderr_fd, channel_fd = fds
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(stdout_fd, 1)
        os.dup2(stderr_fd, 2)
        keep = {0, 1, 2, channel_fd}
        # Nothing of the server's (its socket, its wakeup pipe) reaches the task.
        for fd in _open_fds():
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        # As Python's own stderr: a traceback holding a lone surrogate is printed, not raised.
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False, errors="backslashreplace")
        if request.get("cgroup"):
            # Into the attempt's memory cgroup before any of the task's code runs, while this
            # process may still write there (it drops to the task user below).
            _enter_cgroup(request["cgroup"])
        _become_environment(request["env"])
        if request.get("user"):
            if _CONFINED:
                confinement.confine()  # while still privileged: no no_new_privs needed
            _become_task_user(request["user"], server_pid)

        redis_conn = sys.modules.get("orchestrator.foundation.redis_conn")
        if redis_conn is not None:
            redis_conn._clients.clear()  # never share a Redis socket with the fork server (it has none)
        code = run_forked(channel_fd)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        from orchestrator.worker.task.runner import exit_now

        exit_now(code)


def _enter_cgroup(procs_file: str) -> None:
    """Move this process into the cgroup whose `cgroup.procs` is `procs_file`."""
    with open(procs_file, "w") as handle:
        handle.write(str(os.getpid()))


def _become_environment(env: dict[str, str]) -> None:
    """Make os.environ exactly `env`, touching only the variables that differ: every variable
    rewritten cost each task process some 650 KiB of memory copied from the fork server."""
    for name in [name for name in os.environ if name not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _become_task_user(user: dict[str, Any], server_pid: int) -> None:
    """Drop to the task user for good: its uid and primary gid, no supplementary groups (so no
    capability is left either), in its attempt's own directory. The kernel clears the parent
    death signal on a change of credentials: it is set again."""
    os.setgroups([])
    os.setresgid(user["gid"], user["gid"], user["gid"])
    os.setresuid(user["uid"], user["uid"], user["uid"])
    os.chdir(user["cwd"])
    from orchestrator.worker.task.runner import set_parent_death_signal

    set_parent_death_signal(server_pid)


def direct_spawner() -> str | None:
    """The `setpriv` that gives a directly spawned command the parent-death signal a forked
    task process sets itself; None where there is none (then commands are forked too)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    try:
        usage = subprocess.run([setpriv, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return setpriv if "--pdeathsig" in usage else None


_SETPRIV: str | None = None
# Whether each task user's attempt is put in a Landlock domain of its own (confinement.py).
_CONFINED = False


def _spawn_command(request: dict[str, Any], fds: list[int]) -> int:
    """A command started without a Python in between (`posix_spawn`, no copy of this process):
    its own session, stdin from /dev/null, only the stdout and stderr it was sent, its
    environment as sent, default signal handling, and SIGKILL when this server dies."""
    setpriv = _SETPRIV
    if setpriv is None:  # the launcher asks only a server that said it can: reported as a spawn failure
        raise OSError("this fork server cannot start commands directly (no setpriv with --pdeathsig)")
    if request.get("user") and _CONFINED:  # a confined attempt's command is exec'ed by its task process
        raise OSError("this fork server confines every task user's attempt: it starts no command directly for one")
    stdout_fd, stderr_fd = fds
    actions: list[tuple] = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, stdout_fd, 1),
        (os.POSIX_SPAWN_DUP2, stderr_fd, 2),
    ]
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _open_fds() if fd > 2]
    user = request.get("user")
    switch = ["--reuid", str(user["uid"]), "--regid", str(user["gid"]), "--clear-groups"] if user else []
    argv = [setpriv, *switch, "--pdeathsig", "KILL", "--", *request["argv"]]
    defaults = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE)
    if request.get("cgroup"):
        # posix_spawn cannot put the new process in a cgroup of its own, and moving it once it
        # runs would let the command run (and fork) outside it first. This server is one
        # thread: it steps into the attempt's cgroup for the spawn, so the new process is born
        # there, and back out. Its own memory stays charged where it was (the kernel does not
        # move charges with a process); only what the spawn itself allocates is the attempt's.
        home = _cgroup_home()
        _enter_cgroup(request["cgroup"])
        try:
            return _posix_spawn(setpriv, argv, request["env"], actions, defaults, user)
        finally:
            try:
                _enter_cgroup(home)
            except OSError as exc:  # the command runs, and is watched: never lose it over this
                print(f"fork server: could not step back into its own cgroup: {exc}", file=sys.stderr, flush=True)
    return _posix_spawn(setpriv, argv, request["env"], actions, defaults, user)


def _posix_spawn(setpriv: str, argv: list[str], env: dict[str, str], actions: list[tuple], defaults: tuple, user: dict[str, Any] | None) -> int:
    if not user:
        return os.posix_spawn(setpriv, argv, env, file_actions=actions, setsid=True, setsigdef=defaults)
    # posix_spawn has no working directory of its own here: this server is one thread, so it
    # steps into the attempt's directory for the spawn and back out.
    here = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.chdir(user["cwd"])
        return os.posix_spawn(setpriv, argv, env, file_actions=actions, setsid=True, setsigdef=defaults)
    finally:
        os.fchdir(here)
        os.close(here)


_CGROUP_HOME: str | None = None


def _cgroup_home() -> str:
    """The `cgroup.procs` of this server's own memory cgroup (read once, before it first steps
    out of it)."""
    global _CGROUP_HOME
    if _CGROUP_HOME is None:
        from orchestrator.worker.host.memory import own_procs_file

        home = own_procs_file()
        if home is None:
            raise OSError("this fork server's memory cgroup cannot be found")
        _CGROUP_HOME = home
    return _CGROUP_HOME


def _open_fds() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 256))


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[1]))
    os.set_inheritable(sock.fileno(), False)
    # Its own settings come first, over the socket: in os.environ only, never in the block the
    # kernel shows as this process's (and every forked task's) /proc/PID/environ.
    first = json.loads(sock.recv(MAX_MESSAGE) or b"{}")
    if first.get("op") != "settings":
        sys.exit("fork server: its settings were expected first")
    os.environ.update({str(name): str(value) for name, value in first.get("env", {}).items()})
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
    # Its environment holds platform settings, and its memory what it preloaded: out of reach of
    # a task running under the same user (the task processes it forks inherit this until exec).
    from orchestrator.worker.host.procs import become_undumpable

    become_undumpable()
    codecache.install()  # before any import: every directory's finder then uses its loader
    modules = [m.strip() for m in os.environ.get("ORCHESTRATOR_PRELOAD_MODULES", "").split(",") if m.strip()]
    try:
        preload(modules)
    except PreloadRefused as exc:
        sock.send(json.dumps({"op": "refused", "error": str(exc)}).encode())
        sys.exit(1)
    # What the imports freed goes back to the system rather than into every task's copy.
    from orchestrator.foundation import memtrim

    memtrim.trim()
    # Everything imported so far is never collected: a task process's garbage collector then
    # never walks (and so never copies) the fork server's objects.
    gc.freeze()
    global _SETPRIV, _CONFINED
    _SETPRIV = direct_spawner()
    _CONFINED = confinement.works()
    sock.send(json.dumps({"op": "ready", "pid": os.getpid(), "direct": _SETPRIV is not None, "confined": _CONFINED}).encode())
    server = ForkServer(sock)
    server.fork_spare()
    server.serve()

