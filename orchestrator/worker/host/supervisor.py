"""The supervisor: runs one attempt's task process and watches it until it is over.

It owns everything the task must not be trusted with: the "running" handshake and every
heartbeat (both fenced by the attempt token), the execution timeout, the worker's shutdown
grace, and killing the task's whole process group. It records what it saw in an `Outcome`
for `classify()`; it never decides a retry itself.
"""
from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import InterfaceError, OperationalError

from orchestrator.engine import reporting
from orchestrator.engine import task_state_store as stored_state
from orchestrator.engine.reporting import WorkerInfo
from orchestrator.foundation import task_state
from orchestrator.foundation.outputstore import NoStore, OutputStore
from orchestrator.foundation.sanitise import error_text
from orchestrator.worker.channel import LineReader, message_max_bytes, send, send_json_text
from orchestrator.worker.classify import Outcome, Stop, handshake_refused_context, message_problem, oom_counters_matter, stop_context
from orchestrator.worker.final import BashExited, Final, Succeeded, Terminated, final_of, is_outcome
from orchestrator.worker.host import procs
from orchestrator.worker.host.environment import task_environment
from orchestrator.worker.host.handshake import Handshake
from orchestrator.worker.host.heartbeat import AttemptLease, Heartbeats
from orchestrator.worker.host.launcher import Launcher, TaskHandle
from orchestrator.worker.host.memory import WATCHED, AttemptMemory, MemoryLimits, machine_oom_kills
from orchestrator.worker.host.oom import oom_kill_count
from orchestrator.worker.host.output import BoundedCapture, StoredOutput
from orchestrator.worker.host.shutdown import SHUTDOWN, ShutdownRequest
from retries.context import ExecutionContext
from retries.states import Reason

log = logging.getLogger(__name__)

# How long the loop sleeps at most between looks at the clock (timeouts, shutdown).
TICK = 0.1
# After its process ended, how long to wait for the last output still in the pipes.
DRAIN_SECONDS = 1.0
# How long the exit status may take to come from the fork server once the process ended.
EXIT_STATUS_WAIT = 1.0
# A task that sent its outcome but does not exit within this long is killed.
EXIT_AFTER_OUTCOME_SECONDS = 5.0
# How long a write on a task's channel may find no room (a task that stopped reading what it is
# sent) before the supervisor gives it up and goes on: it must stay free to stop that task.
CHANNEL_STALL_SECONDS = 10.0


@dataclass(frozen=True)
class Plan:
    """One attempt, as the supervisor needs it."""

    task_instance_id: int
    token: int
    task_id: str
    payload: dict[str, Any]
    is_bash: bool
    execution_timeout: float | None
    kill_grace: float
    result_max_bytes: int  # what the task's result may take (the payload tells the task the same)
    # A command to start directly (a bash task), with its own context variables: the handshake
    # is then recorded before it starts, and no Python runs in its process.
    command: tuple[str, ...] | None = None
    command_env: dict[str, str] = field(default_factory=dict)
    # Whether its handshake creates task_started_at deadlines (None: the handshake reads it).
    has_start_deadlines: bool | None = None
    # The context's `results`, as JSON text: sent after the payload, decoded only by the task.
    results_json: str = "{}"
    # MiB: what the task's processes together may use (None: no limit).
    memory_limit_mib: int | None = None


@dataclass(frozen=True)
class SupervisorSettings:
    """What the supervisor enforces on an attempt: its heartbeat, handshake and shutdown times,
    and how much of its output it keeps (read from the settings once per attempt)."""

    heartbeat_interval: float
    heartbeat_timeout: float
    shutdown_grace: float
    startup_timeout: float
    head_bytes: int
    tail_bytes: int
    db_outage_tolerance: float = 0.0


@dataclass
class Supervised:
    """The result of supervising one attempt."""

    superseded: bool  # the attempt is no longer current: report nothing
    outcome: Outcome
    stdout: str = ""
    stderr: str = ""
    output_truncated: bool = False
    # Task state changes the database could not take yet, in order: stored before the outcome.
    task_state_changes: list[dict[str, Any]] = field(default_factory=list)
    # What is left to do once the outcome is reported: a success is reported while its process
    # is still exiting, which is then watched to its end, reaped and released here.
    finish: Callable[[], None] = field(default=lambda: None)


@dataclass
class _Stopping:
    reason: Reason
    context: ExecutionContext
    started_at: float
    timeout: float | None = None
    sigkill_sent: bool = False


@dataclass
class _Streams:
    stdout: BoundedCapture
    stderr: BoundedCapture
    messages: LineReader
    stored: StoredOutput  # the whole output (up to its cap), in the output store
    open_fds: set[int] = field(default_factory=set)


def run_in_this_thread(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return function(*args, **kwargs)


class Supervisor:
    """One attempt in one of the worker's slots (a thread of the worker process)."""

    def __init__(
        self,
        plan: Plan,
        worker: WorkerInfo,
        settings: SupervisorSettings,
        *,
        launcher: Launcher,
        heartbeats: Heartbeats,
        shutdown: ShutdownRequest = SHUTDOWN,
        db: Callable[..., Any] = run_in_this_thread,
        passthrough: tuple[str, ...] = (),
        deny: tuple[str, ...] = (),
        keep_changes: Callable[[int, int, list[dict[str, Any]]], Any] | None = None,
        task_state_max_bytes: int = task_state.DEFAULT_MAX_BYTES,
        output_store: OutputStore | None = None,
        on_started: Callable[[], None] | None = None,
        memory_limits: MemoryLimits | None = None,
    ) -> None:
        self.plan = plan
        self.worker = worker
        self.settings = settings
        self.shutdown = shutdown
        self.launcher = launcher
        self.heartbeats = heartbeats
        self.db = db  # database calls go through the worker's small pool of connections
        self.passthrough = passthrough
        self.deny = deny  # ORCHESTRATOR_TASK_ENV_DENY: never in a task's environment
        # Writes task state changes the database could not take to the worker's disk (durably).
        self.keep_changes = keep_changes
        self.task_state_max_bytes = task_state_max_bytes
        self.output_store = output_store or NoStore()
        self.on_started = on_started or (lambda: None)  # the task's code may run from here on
        self.unstored_changes: list[dict[str, Any]] = []
        self.lease: AttemptLease | None = None
        self.proc: TaskHandle | None = None
        self.pgid = 0
        self.control_fd = -1
        self.selector = selectors.DefaultSelector()
        self.streams: _Streams | None = None
        self.pid_fd: int | None = None
        self.spawned_at = 0.0
        self.handshake = Handshake()
        self.stopping: _Stopping | None = None
        self.final: Final | None = None
        self.final_at: float | None = None
        self.final_before_stop = True
        self.superseded = False
        self.stopped_by_operator = False  # marked failed by an operator: stopping it for them
        self.succeeded_first = False  # it succeeded: reported before its process is over
        # What the task wrote on its channel that is no well-formed message: invalid_result.
        self.channel_problem: dict[str, Any] | None = None
        self.oom_before: int | None = None  # the worker's cgroup's OOM kills when the attempt began
        self.machine_oom_before: int | None = None  # and the machine's
        # The worker's way of limiting memory (a cgroup per attempt, or a watch), and this
        # attempt's limit when it has one.
        self.memory_limits = memory_limits or MemoryLimits(WATCHED)
        self.memory: AttemptMemory | None = None

    # --- the attempt --------------------------------------------------------------------------

    def run(self) -> Supervised:
        metadata: dict[str, Any] = {"worker_name": self.worker.worker_name, "hostname": self.worker.hostname}
        self.oom_before = oom_kill_count()
        self.machine_oom_before = machine_oom_kills()
        # The lease outlives this call: the job forgets it once the outcome is recorded.
        self.lease = self.heartbeats.watch(self.plan.task_instance_id, self.plan.token)
        direct = self.plan.command is not None and self._can_start_directly()
        recorded_running = False
        if direct:
            running = self._handshake_before_start()
            if self.handshake.refused is not None:
                # Nothing started: it is reported as a task that could not be started.
                outcome = Outcome(is_bash=True, started=False, handshake_refused=self.handshake.refused, metadata=metadata)
                return Supervised(superseded=False, outcome=outcome)
            if running is None:
                direct = False  # the database did not answer: the usual handshake waits for it
            elif not running:
                self.superseded = True
                return Supervised(superseded=True, outcome=Outcome(is_bash=True, handshake=False, metadata=metadata))
            else:
                recorded_running = True
        try:
            self._spawn(direct)
        except OSError as exc:
            # Nothing ran. A command whose "running" was already recorded is reported from
            # `running`, or its report would be refused and the task stranded there.
            log.error("could not start the task process for %s: %s", self._label(), exc)
            start_error = f"{type(exc).__name__}: {exc}"
            self._finish_memory()
            outcome = Outcome(is_bash=self.plan.is_bash, started=False, handshake=recorded_running, start_error=start_error, metadata=metadata)
            return Supervised(superseded=False, outcome=outcome)
        try:
            self._supervise()
        except BaseException:
            self._finish()
            raise
        if self.succeeded_first:
            # Its process is only exiting: the report goes now, the rest after it (`finish`).
            self._take_waiting_output()
            supervised = self._supervised(metadata)
            supervised.finish = self._finish_after_success
            return supervised
        self._finish()
        return self._supervised(metadata)

    def _supervised(self, metadata: dict[str, Any]) -> Supervised:
        assert self.proc is not None
        assert self.streams is not None
        metadata["pid"] = self.proc.pid
        # Read again only when the kernel's OOM killer may be why it ended (two reads of /proc
        # less for every other attempt).
        killed = oom_counters_matter(self.proc.returncode)
        stop = None
        if self.stopping is not None:
            stop = Stop(
                reason=self.stopping.reason,
                sigkill_sent=self.stopping.sigkill_sent,
                timeout=self.stopping.timeout,
                kill_grace=self.plan.kill_grace,
                shutdown_signal=self.shutdown.signal,
            )
        outcome = Outcome(
            is_bash=self.plan.is_bash,
            handshake=self.handshake.recorded,
            handshake_refused=self.handshake.refused,
            returncode=self.proc.returncode,
            fork_server_died=self.proc.server_died,
            final=self.final,
            final_before_stop=self.final_before_stop,
            stop=stop,
            stderr_tail=self.streams.stderr.tail_text(),
            stdout_tail=self.streams.stdout.tail_text() if self.plan.is_bash else "",
            stdout_truncated=self.streams.stdout.truncated,
            result_max_bytes=self.plan.result_max_bytes,
            channel_problem=self.channel_problem,
            channel_unfinished=self.streams.messages.unfinished,
            oom_kills_before=self.oom_before,
            oom_kills_after=oom_kill_count() if killed else None,
            machine_oom_kills_before=self.machine_oom_before,
            machine_oom_kills_after=machine_oom_kills() if killed else None,
            metadata=metadata,
        )
        if self.memory is not None:
            report = self.memory.measure()
            outcome.memory_limit_mib, outcome.memory_enforced_by = report.limit_mib, report.enforced_by
            outcome.peak_memory_mib, outcome.memory_exceeded = report.peak_mib, report.exceeded
            outcome.killed_by_host_oom = report.killed_by_host_oom
        return Supervised(
            superseded=self.superseded,
            outcome=outcome,
            stdout=self.streams.stdout.text(),
            stderr=self.streams.stderr.text(),
            output_truncated=self.streams.stdout.truncated or self.streams.stderr.truncated,
            task_state_changes=list(self.unstored_changes),
        )

    def _can_start_directly(self) -> bool:
        try:
            self.launcher.start()
        except OSError:
            return False
        return self.launcher.direct

    def _handshake_before_start(self) -> bool | None:
        """Record "running" before a command starts directly: True to start it, False when the
        attempt is no longer current, None when the database did not answer or refused it
        (`handshake.refused` then says why)."""
        try:
            return bool(self._mark_running(pid=None))
        except (OperationalError, InterfaceError):
            self.handshake.ambiguous = True  # it may have committed all the same
            log.warning("could not record that %s is running; starting it the usual way", self._label())
            return None
        except Exception as exc:
            self._refuse_handshake(exc)
            return None

    def _refuse_handshake(self, exc: Exception) -> str:
        """The database answered the handshake with an error that is no lost connection (bad
        data, a constraint, a trigger): asking again would get the same answer. The task is
        never told "go", and the attempt is reported as one that could not be started."""
        log.exception("the database refused to record that %s is running; it will not run", self._label())
        self.handshake.refused = error_text(exc)
        return self.handshake.refused

    def _spawn(self, direct: bool = False) -> None:
        stdout_read, stdout_write = os.pipe()
        stderr_read, stderr_write = os.pipe()
        # The task's channel: one socket, both ways (the only descriptor it holds besides 0-2).
        channel, task_channel = (end.detach() for end in socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM))
        theirs = [stdout_write, stderr_write, task_channel]
        ours = [stdout_read, stderr_read, channel]
        env = {**task_environment(os.environ, self.passthrough, self.deny), "PYTHONUNBUFFERED": "1"}
        if direct:
            env.update(self.plan.command_env)
        try:
            # Its memory limit: a cgroup it is born into, or a watch once it runs.
            self.memory = self.memory_limits.attempt(self.plan.task_instance_id, self.plan.token, self.plan.memory_limit_mib)
            cgroup = self.memory.procs_file if self.memory is not None else None
            if direct:  # only its output: no pipe to a Python runner that is not there
                self.proc = self.launcher.spawn(theirs[:2], env, list(self.plan.command or ()), cgroup=cgroup)
            else:
                self.proc = self.launcher.spawn(theirs, env, cgroup=cgroup, callable_path=self.plan.payload.get("python_callable") or None)
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:  # the task process has its own copies now
                os.close(fd)
        self.spawned_at = time.monotonic()
        self.pgid = self.proc.pgid
        if self.memory is not None:
            self.memory.started(self.proc.pid)
        self.control_fd = channel
        self.stdout_fd, self.stderr_fd = stdout_read, stderr_read
        self.streams = _Streams(
            stdout=BoundedCapture(self.settings.head_bytes, self.settings.tail_bytes),
            stderr=BoundedCapture(self.settings.head_bytes, self.settings.tail_bytes),
            # The task's channel: bounded, and every line must be a message (`_on_malformed`).
            messages=LineReader(channel, max_bytes=message_max_bytes(self.plan.result_max_bytes, self.task_state_max_bytes)),
            stored=StoredOutput(self.output_store, (self.plan.task_instance_id, self.plan.token), self._label()),
        )
        for fd in (stdout_read, stderr_read, channel):
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ)
            self.streams.open_fds.add(fd)
        self.pid_fd = procs.pidfd(self.proc.pid)
        if self.pid_fd is not None:
            self.selector.register(self.pid_fd, selectors.EVENT_READ)
        if not direct:
            send(self.control_fd, self.plan.payload, CHANNEL_STALL_SECONDS)
            send_json_text(self.control_fd, self.plan.results_json, CHANNEL_STALL_SECONDS)
            return
        self.handshake.at = time.monotonic()  # recorded before the start
        self.on_started()
        try:
            self.db(reporting.record_pid, self.plan.task_instance_id, self.plan.token, self.proc.pid)
        except Exception:  # only for operators' eyes: the started command must not go unwatched
            log.warning("could not record the pid of %s", self._label(), exc_info=True)

    def _succeeded(self) -> bool:
        """A Python task sent its success (the runner flushes its output first) before any stop:
        nothing it does from here can change its outcome, and its output is in the pipes."""
        return (
            not self.plan.is_bash
            and self.handshake.recorded
            and self.stopping is None
            and self.channel_problem is None
            and isinstance(self.final, Succeeded)
        )

    def _finish_after_success(self) -> None:
        """After the report of a success sent before its process ended: watch the process to its
        end as for any task (killed EXIT_AFTER_OUTCOME_SECONDS after its outcome if it hangs),
        then its group's stragglers, then reap and close everything."""
        assert self.proc is not None
        try:
            while not self.proc.exited():
                self._pump(TICK)
                self._enforce(time.monotonic())
            self._let_stragglers_go()
        finally:
            self._finish()

    def _take_waiting_output(self) -> None:
        """Read what is waiting in the output pipes now, without waiting for more."""
        assert self.streams is not None
        for fd in (self.stdout_fd, self.stderr_fd):
            while fd in self.streams.open_fds and self._read_output(fd):
                pass

    def _supervise(self) -> None:
        assert self.proc is not None
        assert self.lease is not None
        while not self.superseded:
            self._pump(TICK)
            if self._succeeded():
                # Its process is still exiting (tearing down a copy of the fork server takes
                # about a millisecond): the report need not wait for that.
                self.succeeded_first = True
                return
            if self.lease.refused and not self.stopped_by_operator:
                self._on_refused()
            elif self.lease.expired() and not self.stopped_by_operator:
                log.error("%s: no heartbeat got through for too long; killing the task before the scheduler presumes it lost", self._label())
                self.superseded = True
            if self.superseded:
                break
            now = time.monotonic()
            if self.handshake.retry_due(now):
                self._handshake()
            self._enforce(now)
            self._watch_memory(now)
            if self.proc.exited():
                if self.proc.lease_expired:
                    # Killed by the fork server while this worker could not renew its lease (it
                    # was stopped): the scheduler presumes it lost, so report nothing over that.
                    self.superseded = True
                    break
                self._bash_outcome()
                break
        if self.stopped_by_operator:
            self.superseded = True  # the operator's `failed` stands: nothing to report
            self._let_stragglers_go()
            return
        if self.superseded:
            # Another attempt owns the task now: never let two copies run at once.
            log.warning("%s was superseded; killing its task process group %s", self._label(), self.pgid)
            procs.signal_group(self.pgid, signal.SIGKILL)
            return
        self._let_stragglers_go()

    def _bash_outcome(self) -> None:
        """A bash task's process is bash itself: its exit status is its outcome."""
        if not self.plan.is_bash or not self.handshake.recorded or self.final is not None:
            return
        assert self.proc is not None  # called once it exited
        code = self.proc.returncode
        if code is not None and code >= 0:
            self.final = Succeeded(None) if code == 0 else BashExited(code)
            self.final_at = time.monotonic()
            self.final_before_stop = self.stopping is None

    def _let_stragglers_go(self) -> None:
        """The task process ended. Its group's other processes get the rest of the stop's grace
        (they got the same SIGTERM), then SIGKILL; after a normal end they are killed at once."""
        stopping = self.stopping
        if stopping is not None and not stopping.sigkill_sent:
            deadline = stopping.started_at + self.plan.kill_grace
            while time.monotonic() < deadline and len(procs.live_members(self.pgid)) > 0:
                self._pump(min(TICK, max(0.0, deadline - time.monotonic())))
            if procs.live_members(self.pgid):
                stopping.sigkill_sent = True
        procs.signal_group(self.pgid, signal.SIGKILL)

    def _finish(self) -> None:
        """Reap everything, read the last output, release every descriptor."""
        assert self.proc is not None
        assert self.streams is not None
        if not self.proc.exited():
            procs.signal_group(self.pgid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + DRAIN_SECONDS
        while self.streams.open_fds and time.monotonic() < deadline:
            self._pump(min(TICK, max(0.0, deadline - time.monotonic())))
        # Everything left in the group was SIGKILLed: collect those that came back to us.
        deadline = time.monotonic() + DRAIN_SECONDS
        while not procs.reap_group(self.pgid) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.proc.release()  # its group was SIGKILLed: the fork server may reap it now
        self._finish_memory()
        for fd in list(self.streams.open_fds):
            self._close_stream(fd)
        self.streams.stored.close()
        if self.pid_fd is not None:
            self.selector.unregister(self.pid_fd)
            os.close(self.pid_fd)
        self.selector.close()
        for fd in (self.control_fd, self.stdout_fd, self.stderr_fd):
            os.close(fd)

    # --- one round of the loop ------------------------------------------------------------------

    def _pump(self, timeout: float) -> None:
        """Wait up to `timeout` for output, messages or the process's end, and take them in."""
        assert self.proc is not None
        assert self.streams is not None
        for key, _ in self.selector.select(timeout):
            fd = key.fd
            if fd == self.pid_fd:
                # It stays readable once the process ended: stop watching it, or select() spins.
                self.selector.unregister(fd)
                os.close(fd)
                self.pid_fd = None
                # Its exit status comes from the fork server a moment later: wait for it here
                # rather than a whole tick.
                self.proc.wait(timeout=EXIT_STATUS_WAIT)
                continue
            if fd == self.streams.messages.fd:
                channel = self.streams.messages
                for message in channel.feed():
                    problem = message_problem(message)
                    if problem is not None:
                        channel.refuse(problem)
                        break
                    self._on_message(message)
                if channel.problem is not None:
                    self._on_malformed(channel.problem)
                if channel.eof:
                    self._close_stream(fd)
                continue
            self._read_output(fd)

    def _read_output(self, fd: int) -> bool:
        """Keep one chunk of stdout or stderr, or its end; False when nothing was waiting."""
        assert self.streams is not None
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""  # as good as its end
        if not chunk:
            self._close_stream(fd)
            return True
        stream = "stdout" if fd == self.stdout_fd else "stderr"
        capture = self.streams.stdout if fd == self.stdout_fd else self.streams.stderr
        capture.feed(chunk)
        self.streams.stored.feed(stream, chunk)
        return True

    def _close_stream(self, fd: int) -> None:
        assert self.streams is not None
        if fd in self.streams.open_fds:
            self.streams.open_fds.discard(fd)
            self.selector.unregister(fd)  # each closed in _finish, the channel after its last write

    def _on_malformed(self, problem: dict[str, Any]) -> None:
        """The task wrote something on its channel that is no well-formed message: the attempt
        fails as application/invalid_result (the task's doing, never the platform's), and its
        process group is killed at once, as nothing it says can be read any more. A task being
        stopped already, or whose success was reported, keeps that outcome."""
        if self.channel_problem is not None or self.stopping is not None or self.succeeded_first:
            return
        self.channel_problem = problem
        log.warning("%s wrote a malformed message on its channel (%s); failing it as invalid_result", self._label(), problem.get("problem"))
        procs.signal_group(self.pgid, signal.SIGKILL)

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        final = final_of(message)
        if kind == "running":
            self._handshake()
        elif isinstance(final, Terminated):
            if self.final is None:
                self.final = final  # unless it said how it ended
        elif final is not None:
            if self.final is None or isinstance(self.final, Terminated):
                self.final = final
                self.final_at = time.monotonic()
                self.final_before_stop = self.stopping is None
        elif kind == task_state.STATE_MESSAGE:
            send(self.control_fd, {"type": task_state.STATE_REPLY, **self._store_task_state(message)}, CHANNEL_STALL_SECONDS)

    def _store_task_state(self, message: dict[str, Any]) -> dict[str, Any]:
        """Make one task state change durable, fenced by the attempt token, and say how: in the
        database; or, while the database is away, on the worker's disk, to be stored before the
        attempt's outcome (in order: later changes queue behind it)."""
        try:
            key, value = task_state.validated(str(message.get("op")), message.get("key"), message.get("value"), max_bytes=self.task_state_max_bytes)
        except ValueError as exc:
            return {"status": task_state.INVALID, "error": str(exc)}
        if self.superseded or (self.lease is not None and self.lease.refused) or not self.handshake.recorded:
            return {"status": task_state.STALE}
        self.unstored_changes.append({"op": message["op"], "key": key, "value": value})
        try:
            stored = self.db(stored_state.apply, self.plan.task_instance_id, self.plan.token, self.unstored_changes)
        except (OperationalError, InterfaceError):
            if self.keep_changes is None:
                self.unstored_changes.pop()
                return {"status": task_state.STALE}
            try:
                self.keep_changes(self.plan.task_instance_id, self.plan.token, self.unstored_changes)
            except OSError:
                log.exception("%s: could not keep a task state change on disk", self._label())
                self.unstored_changes.pop()
                return {"status": task_state.STALE}
            log.warning("%s: the database is away; its task state change waits on the worker's disk", self._label())
            return {"status": task_state.KEPT}
        except Exception as exc:
            # Refused for what it is (not for want of a connection): the task hears it as a
            # ValueError, as for any value it may not store, and nothing changed.
            self.unstored_changes.pop()
            log.exception("%s: the database refused a task state change", self._label())
            return {"status": task_state.INVALID, "error": f"the database refused it: {error_text(exc)}"}
        if not stored:
            self.unstored_changes.clear()
            log.warning("%s: a task state change was refused: the attempt was superseded", self._label())
            return {"status": task_state.STALE}
        self.unstored_changes.clear()
        if self.keep_changes is not None:
            self.keep_changes(self.plan.task_instance_id, self.plan.token, [])
        return {"status": task_state.STORED}

    def _handshake(self) -> None:
        assert self.proc is not None
        if self.handshake.recorded or self.stopping is not None or self.proc.exited():
            return  # a handshake read after the process died must not mark it running
        try:
            won = self._mark_running(pid=self.proc.pid)
        except (OperationalError, InterfaceError):
            if self.handshake.unanswered(time.monotonic(), self.settings.db_outage_tolerance):
                # The task waits before its user code; the outage charges nothing.
                log.warning("could not record that %s is running; trying again", self._label())
                return
            # It never ran as far as the database knows; stop it before user code starts.
            log.exception("could not record that %s is running", self._label())
            self._begin_stop(Reason.DB_CONNECTION_ERROR, timeout=None)
            return
        except Exception as exc:
            context = handshake_refused_context(self._refuse_handshake(exc), {"worker_name": self.worker.worker_name})
            self._begin_stop(Reason.PRE_EXECUTION_FAILURE, timeout=None, context=context)
            return
        self.handshake.retry_at = None
        if not won and self.handshake.ambiguous:
            won = self._earlier_handshake_committed()
        if not won:
            self.superseded = True
            return
        self.handshake.at = time.monotonic()
        send(self.control_fd, {"type": "go"}, CHANNEL_STALL_SECONDS)
        self.on_started()

    def _mark_running(self, *, pid: int | None) -> bool:
        plan = self.plan
        return bool(self.db(reporting.mark_running, plan.task_instance_id, plan.token, pid=pid, has_start_deadlines=plan.has_start_deadlines))

    def _earlier_handshake_committed(self) -> bool:
        """A handshake whose answer was lost (the connection broke after its commit) is refused
        when tried again, since the task is already `running`. Only this attempt holds its
        token, so `running` under it is our own handshake: a heartbeat fenced by the token and
        `running` says so, and the task goes on instead of being killed as superseded."""
        try:
            return bool(self.db(reporting.heartbeat, self.plan.task_instance_id, self.plan.token))
        except Exception:  # unknown: never let a task run that may not be this attempt's
            log.warning("could not check whether %s's handshake committed", self._label(), exc_info=True)
            return False

    def _enforce(self, now: float) -> None:
        """Timeouts, the shutdown grace, and SIGKILL after kill_grace."""
        stopping = self.stopping
        if self.final_at is not None and is_outcome(self.final):
            if now - self.final_at > EXIT_AFTER_OUTCOME_SECONDS:
                procs.signal_group(self.pgid, signal.SIGKILL)
            return
        if stopping is None:
            timeout = self.plan.execution_timeout
            started = self.handshake.at
            if started is not None and timeout is not None and now - started >= timeout:
                self._begin_stop(Reason.EXECUTION_TIMEOUT, timeout=timeout)
            elif self.shutdown.grace_over(self.settings.shutdown_grace, now):
                self._begin_stop(Reason.WORKER_TERMINATION, timeout=None)
            elif not self.handshake.recorded and now - self.spawned_at >= self.settings.startup_timeout:
                self._begin_stop(Reason.PRE_EXECUTION_FAILURE, timeout=self.settings.startup_timeout)
        elif not stopping.sigkill_sent and now - stopping.started_at >= self.plan.kill_grace:
            log.warning("%s did not stop within %ss of SIGTERM; sending SIGKILL to its group", self._label(), self.plan.kill_grace)
            stopping.sigkill_sent = True
            procs.signal_group(self.pgid, signal.SIGKILL)

    def _watch_memory(self, now: float) -> None:
        """Past its memory limit (the kernel killed one of its processes in its cgroup, or its
        watched tree is over): every process of it is killed now, whatever they would do next."""
        if self.memory is None or self.succeeded_first or not self.memory.check(now):
            return
        report = self.memory.report
        log.warning("%s went past its memory limit of %s MiB (%s); killing its processes", self._label(), report.limit_mib, report.enforced_by)
        procs.signal_group(self.pgid, signal.SIGKILL)

    def _finish_memory(self) -> None:
        """Its processes are gone: its last measures are taken and its cgroup removed."""
        if self.memory is not None:
            try:
                self.memory.finish()
            except Exception:  # never lose an attempt's outcome over its cgroup
                log.exception("%s: could not finish its memory limit", self._label())

    def _on_refused(self) -> None:
        """The attempt is no longer current. An operator who marked it failed gets the stop
        sequence (on_kill hears why); anything else (a newer attempt) means kill at once."""
        try:
            context = self.db(reporting.operator_stop, self.plan.task_instance_id, self.plan.token)
        except Exception:  # either way the attempt is no longer current: kill it
            log.warning("could not read why %s is no longer current", self._label(), exc_info=True)
            context = None
        if context is None:
            self.superseded = True
        elif self.stopping is None:
            self.stopped_by_operator = True
            self._begin_stop(context.reason, timeout=None, context=context)

    def _begin_stop(self, reason: Reason, *, timeout: float | None, context: ExecutionContext | None = None) -> None:
        """Tell the task why, then SIGTERM its whole group; SIGKILL follows after kill_grace."""
        if context is None:
            stop = Stop(reason=reason, timeout=timeout, kill_grace=self.plan.kill_grace, shutdown_signal=self.shutdown.signal)
            context = stop_context(stop, signal_sent="SIGTERM", kill_grace=self.plan.kill_grace)
        log.warning("stopping %s: %s", self._label(), reason.value)
        self.stopping = _Stopping(reason=reason, context=context, started_at=time.monotonic(), timeout=timeout)
        send(self.control_fd, {"type": "stop", "context": context.to_dict()}, CHANNEL_STALL_SECONDS)
        procs.signal_group(self.pgid, signal.SIGTERM)

    def _label(self) -> str:
        return f"task {self.plan.task_id} (instance {self.plan.task_instance_id}, attempt {self.plan.token})"

