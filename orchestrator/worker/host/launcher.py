"""The worker's side of its fork server: start it, ask it for task processes, learn how they end.

One `Launcher` per worker process, shared by all its slots. Requests go out on one
SOCK_SEQPACKET socket under a lock; one reader thread takes every reply and exit status and
hands each to the slot waiting for it. If the fork server dies, every task group it started is
killed (nothing may run unwatched) and the next spawn starts a new server.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field

from orchestrator.worker.host.taskuser import AttemptHomes, TaskUser

log = logging.getLogger(__name__)

START_TIMEOUT = 120.0  # the server imports Django and the preloaded modules first
REPLY_TIMEOUT = 30.0


class LaunchError(OSError):
    """The task process could not be started."""


@dataclass
class TaskHandle:
    """A task process started by the fork server (not our child: its status comes from there)."""

    pid: int
    launcher: Launcher
    _ended: threading.Event = field(default_factory=threading.Event)
    returncode: int | None = None  # Popen convention: negative = killed by that signal
    lease_expired: bool = False  # the fork server killed it: the worker's lease ran out
    server_died: bool = False  # it died with its fork server (killed, OOM): the platform's failure
    abandoned: bool = False  # started after its slot gave up waiting: killed at once
    home: str | None = None  # its attempt's own directory (with a task user), removed on release

    @property
    def pgid(self) -> int:
        return self.pid  # a session leader: its pid is its group's id

    def exited(self) -> bool:
        return self._ended.is_set()

    def wait(self, timeout: float | None = None) -> int | None:
        self._ended.wait(timeout)
        return self.returncode

    def release(self) -> None:
        """We are done signalling its group: the fork server may reap it, and its attempt's
        directory goes."""
        self.launcher._send({"op": "release", "pid": self.pid})
        if self.home is not None:
            self.launcher.remove_home(self.home)
            self.home = None

    def _end(self, status: int, lease_expired: bool = False, server_died: bool = False) -> None:
        self.returncode = status
        self.lease_expired = lease_expired
        self.server_died = server_died
        self._ended.set()


class Launcher:
    def __init__(
        self, environment: dict[str, str] | None = None, task_user: TaskUser | None = None, settings: dict[str, str] | None = None
    ) -> None:
        self.environment = environment  # what the fork server is started with (the worker's by default)
        self.settings = dict(settings or {})  # what it adds to its os.environ, sent over its socket
        self.task_user = task_user  # every task process runs as this user, when set
        self._homes: AttemptHomes | None = None  # made with the first attempt
        self._lock = threading.Lock()  # one request on the socket at a time
        self._state_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[threading.Event, dict]] = {}
        self._handles: dict[int, TaskHandle] = {}
        self._sock: socket.socket | None = None
        self._server: subprocess.Popen | None = None
        self.direct = False  # the server can start a command with no Python in between
        self.confined = False  # each attempt of a task user gets a Landlock domain of its own
        self._lease_seconds: float | None = None  # the worker's lease, once it has one
        self.reply_timeout = REPLY_TIMEOUT

    # --- life of the server ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the fork server and wait until it has imported everything it preloads."""
        with self._state_lock:
            if self._sock is not None:
                return
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                self._server = subprocess.Popen(
                    [sys.executable, "-m", "orchestrator.worker.forkserver", str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    # Outside the worker's group: a kill of that group must leave it alive to
                    # kill the task groups. It notices the worker's death by end-of-file.
                    start_new_session=True,
                    env=self.environment,
                )
            finally:
                theirs.close()
            ours.settimeout(START_TIMEOUT)
            try:
                ours.send(json.dumps({"op": "settings", "env": self.settings}).encode())
                ready = json.loads(ours.recv(4096) or b"{}")
            except (OSError, ValueError) as exc:
                ours.close()
                self._server.kill()
                self._server.wait()
                raise LaunchError(f"the fork server did not start: {exc}") from exc
            if ready.get("op") != "ready":
                ours.close()
                self._server.kill()
                self._server.wait()
                raise LaunchError(ready.get("error") or "the fork server did not start (see the worker's log for its error)")
            ours.settimeout(None)
            # A task user's attempts are confined by their own task process before it becomes
            # the user (or execs bash): none of them is started directly.
            self.confined = bool(ready.get("confined"))
            self.direct = bool(ready.get("direct")) and not (self.confined and self.task_user is not None)
            self._sock = ours
            threading.Thread(target=self._read_replies, args=(ours,), name="fork-server-reader", daemon=True).start()

    def server_pids(self) -> set[int]:
        """The fork server's pid: a child of the worker that only its Popen may reap."""
        server = self._server
        return {server.pid} if server is not None else set()

    def close(self) -> None:
        """Stop the server: it SIGKILLs any task group still alive, then exits."""
        with self._state_lock:
            sock, server = self._sock, self._server
            self._sock = None
            homes, self._homes = self._homes, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        if server is not None:
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        if homes is not None:
            homes.close()

    # --- attempts' directories --------------------------------------------------------------------

    def _make_home(self) -> str | None:
        """A private directory for the next attempt, when tasks run as a task user."""
        if self.task_user is None:
            return None
        with self._state_lock:
            if self._homes is None:
                self._homes = AttemptHomes(self.task_user)
            homes = self._homes
        return homes.make()

    def remove_home(self, path: str) -> None:
        homes = self._homes
        if homes is not None:
            homes.remove(path)

    # --- requests -------------------------------------------------------------------------------

    def spawn(
        self, fds: list[int], env: dict[str, str], argv: list[str] | None = None, *, cgroup: str | None = None, callable_path: str | None = None
    ) -> TaskHandle:
        """A new task process holding `fds` (stdout, stderr, its end of the channel);
        with `argv` (and `direct`), that command itself, holding only `fds` (stdout, stderr).
        With `cgroup` (a `cgroup.procs` file), the process is in that cgroup before it runs
        anything of the task's. `callable_path`: the task's callable, whose modules the fork server
        compiles for the task processes it forks later (`forkserver/codecache.py`)."""
        self.start()
        request_id = next(self._ids)
        done = threading.Event()
        reply: dict = {}
        with self._state_lock:
            self._pending[request_id] = (done, reply)
        request: dict = {"op": "spawn", "id": request_id, "env": env, "lease": self._lease_seconds}
        if argv is not None:
            request["argv"] = argv
        if cgroup is not None:
            request["cgroup"] = cgroup
        if callable_path:
            request["compile"] = callable_path
        home = self._make_home()
        if home is not None and self.task_user is not None:
            # Its home, its temporary files and its working directory: the attempt's own.
            request["env"] = {**env, "HOME": home, "TMPDIR": home, "PWD": home}
            request["user"] = {"uid": self.task_user.uid, "gid": self.task_user.gid, "cwd": home}
        try:
            handle = self._request_spawn(request_id, request, fds, done, reply)
        except BaseException:
            if home is not None:
                self.remove_home(home)
            raise
        handle.home = home
        return handle

    def _request_spawn(self, request_id: int, request: dict, fds: list[int], done: threading.Event, reply: dict) -> TaskHandle:
        message = json.dumps(request).encode()
        try:
            with self._lock:
                sock = self._sock
                if sock is None:
                    raise LaunchError("the fork server is gone")
                socket.send_fds(sock, [message], fds)
        except OSError as exc:
            with self._state_lock:
                self._pending.pop(request_id, None)
            raise LaunchError(f"could not reach the fork server: {exc}") from exc
        if not done.wait(self.reply_timeout):
            with self._state_lock:
                self._pending.pop(request_id, None)
            if not done.is_set():
                raise LaunchError("the fork server did not answer")
        if reply.get("op") != "spawned":
            raise LaunchError(reply.get("error") or "the fork server did not answer")
        return reply["handle"]

    def keep_alive(self, seconds: float) -> None:
        """The worker's heartbeats got through: its task processes may run `seconds` more. A
        spawn carries the same lease (its claim was a heartbeat that got through)."""
        self._lease_seconds = seconds
        self._send({"op": "alive", "seconds": seconds})

    def let_spare_idle(self, seconds: float) -> None:
        """How long the fork server keeps a spare task process no attempt took (its own
        default otherwise: `forkserver.server.SPARE_IDLE_SECONDS`)."""
        self._send({"op": "spare_idle", "seconds": seconds})

    def _send(self, message: dict) -> None:
        try:
            with self._lock:
                if self._sock is not None:
                    self._sock.send(json.dumps(message).encode())
        except OSError:
            pass

    # --- replies --------------------------------------------------------------------------------

    def _read_replies(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                self._server_gone(sock)
                return
            message = json.loads(data)
            op = message.get("op")
            if op in ("spawned", "spawn_failed"):
                # The server sends "spawned" before it can see that child exit: order holds.
                with self._state_lock:
                    handle = None
                    if op == "spawned":
                        handle = self._handles[message["pid"]] = TaskHandle(message["pid"], self)
                    waiting = self._pending.pop(message["id"], None)
                if waiting is not None:
                    done, reply = waiting
                    reply.update(message, handle=handle)
                    done.set()
                elif handle is not None:
                    # The slot gave up waiting before this reply came: nobody watches that
                    # process, so it must not run.
                    log.error("the fork server started pid %s after its request was given up; killing it", handle.pid)
                    handle.abandoned = True
                    _kill_group(handle.pgid)
            elif op == "exited":
                with self._state_lock:
                    handle = self._handles.pop(message["pid"], None)
                if handle is not None:
                    handle._end(int(message["status"]), bool(message.get("lease_expired")))
                    if handle.abandoned:
                        handle.release()

    def _server_gone(self, sock: socket.socket) -> None:
        """The fork server died: its task processes died with it (PR_SET_PDEATHSIG); kill what
        they started too, and let the next spawn start a new server."""
        with self._state_lock:
            if self._sock is sock:
                self._sock = None
                log.error("the fork server exited; killing its task groups and starting a new one on the next task")
            handles, self._handles = self._handles, {}
            pending, self._pending = self._pending, {}
        for handle in handles.values():
            _kill_group(handle.pgid)
            handle._end(-signal.SIGKILL, server_died=True)
        for done, reply in pending.values():
            reply["error"] = "the fork server exited"
            done.set()
        if self._server is not None:
            try:
                self._server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def _kill_group(pgid: int) -> None:
    """SIGKILL a task's group and its leader (which may not have called setsid() yet)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pgid, signal.SIGKILL)
        except OSError:
            pass
