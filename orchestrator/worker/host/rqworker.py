"""The RQ worker behind `run_worker`: one process, N slots.

The main thread is RQ's own loop; it takes a job only when a slot is free, so queued work stays
in Redis for other workers. Each job runs in a slot (a thread) that claims the attempt and
supervises its task process; task processes come from the worker's fork server (`launcher.py`),
which is also its watchdog. One heartbeat thread beats for every attempt at once, and every
database call of the slots goes through a pool of two connections (`runtime.DatabasePool`), so the
number of connections does not grow with the concurrency. An attempt's job is recorded in RQ in
one round trip when a slot takes it and one when it ends (`rqrecords.py`: what the engine reads
of it, without RQ's executions and started registry); any other job goes through RQ's own
handling, with its own execution.

It replaces RQ's signal handling: RQ's warm shutdown waits for the jobs forever and its cold
shutdown kills them without a word. Here SIGTERM or SIGINT stops taking jobs and lets the
running tasks go on for ORCHESTRATOR_WORKER_SHUTDOWN_GRACE seconds, after which each supervisor
stops its task and reports `infrastructure/worker_termination`; a second signal ends the grace
at once. SIGUSR1 only stops taking jobs (a drain: the worker exits when its tasks end), without
starting the grace.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, connections
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq.exceptions import StopRequested
from rq.executions import Execution
from rq.job import Job
from rq.queue import Queue
from rq.timeouts import BaseDeathPenalty
from rq.utils import now
from rq.worker import SimpleWorker, WorkerStatus

from orchestrator.engine.reporting import Claimed
from orchestrator.foundation.memtrim import IdleTrim
from orchestrator.worker.classify import signal_name
from orchestrator.worker.host import procs, rqrecords
from orchestrator.worker.host.environment import fork_server_settings, task_environment
from orchestrator.worker.host.heartbeat import Heartbeats
from orchestrator.worker.host.job import deliver_spooled, run_claimed
from orchestrator.worker.host.launcher import Launcher
from orchestrator.worker.host.memory import WATCH_INTERVAL, WATCHED, MemoryLimits
from orchestrator.worker.host.runtime import DatabasePool, WorkerRuntime, install, runtime
from orchestrator.worker.host.shutdown import SHUTDOWN
from orchestrator.worker.host.spool import Spool
from orchestrator.worker.host.taskuser import TaskUser, describe

log = logging.getLogger(__name__)

DATABASE_CONNECTIONS = 2  # for the slots; the heartbeat thread has one more of its own
SPOOL_INTERVAL = 1.0  # seconds between attempts to deliver spooled reports
# How long a thread may hold the GIL while another waits for it (Python's default: 5 ms). Every
# step of a job is a short wait on Redis, the database or the fork server; with many slots
# busy, each of those waits then cost up to 5 ms of GIL handover and RQ's loop, taking one job
# after another, ran at half speed (a 300-task fan-out: 85 -> 115 tasks/s at 1 ms).
GIL_SWITCH_INTERVAL = 0.001
# How long one blocking pop waits for a job. A worker cut off from Redis abandons its connection,
# but Redis keeps that connection's pop waiting until the pop times out, and would hand it the
# next job, lost with the dead connection: a short pop bounds that window to a few seconds
# after a partition begins (RQ's own default is some 400 s).
DEQUEUE_TIMEOUT = 5
# How long a slot that handed its place on waits for the task it handed to reach its first line
# before doing its own after-work (reaping its task process, ending its RQ job): on two cores
# that work, done at once, took the interpreter from the next task's start, a chain's step.
HAND_ON_HEAD_START = 0.2
# How often the worker removes memory cgroups left behind (by its attempts, by dead workers).
SWEEP_INTERVAL = 5.0
# RQ beats the worker's key (three round trips) twice for every job it takes, for a key that
# lives for minutes; the heartbeat thread beats it every interval anyway (the beat by which
# others judge its liveness). RQ's own beats: at most once a second, in one round trip.
RQ_HEARTBEAT_EVERY = 1.0
# RQ asks Redis whether `rq suspend` was said before every job it takes: a round trip on the
# main loop's way from one job to the next. Asked at most this often (seconds).
SUSPENSION_CHECK_EVERY = 1.0
# Redis away: what RQ's loop would take for a reason to quit (it quits on a timeout outside its
# blocking pop) when it only failed to write a record of its own.
REDIS_AWAY = (RedisConnectionError, RedisTimeoutError)


class NoDeathPenalty(BaseDeathPenalty):
    """The supervisor enforces execution_timeout; RQ's SIGALRM would only work in one thread."""

    def setup_death_penalty(self) -> None:
        pass

    def cancel_death_penalty(self) -> None:
        pass


class OrchestratorWorker(SimpleWorker):
    death_penalty_class = NoDeathPenalty

    def __init__(
        self, *args: Any, concurrency: int = 1, task_user: TaskUser | None = None, memory_limits: MemoryLimits | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.concurrency = max(1, int(concurrency))
        self.task_user = task_user
        self.memory_limits = memory_limits or MemoryLimits(WATCHED)
        self._swept_at = 0.0
        self._free_slots = threading.Semaphore(self.concurrency)
        self._slots: set[threading.Thread] = set()
        self._running: dict[str, tuple[Job, Execution | None]] = {}  # None: an attempt's job (rqrecords)
        self._busy_lock = threading.Lock()
        self._dequeuing = False
        self._handed: set[threading.Thread] = set()  # slots running a task handed to them, not an RQ job
        self._slot_local = threading.local()  # per slot: whether it passed its place on
        self._rq_beat_at = float("-inf")
        self._suspension_checked_at = float("-inf")
        # What the slots freed, given back to the system at the first heartbeat that finds none running.
        self._idle_trim = IdleTrim(after=0.0)

    # --- start and stop ---------------------------------------------------------------------------

    def work(self, *args: Any, **kwargs: Any) -> bool:
        sys.setswitchinterval(GIL_SWITCH_INTERVAL)
        if self.task_user is not None:
            log.info("worker %s: tasks run as user %s (uid %s, gid %s)", self.name, self.task_user.name, self.task_user.uid, self.task_user.gid)
        else:
            log.info("worker %s: tasks run as the worker's own user (no ORCHESTRATOR_TASK_USER)", self.name)
        if self.memory_limits.directory is not None:
            log.info("worker %s: memory limits enforced by a cgroup per attempt, under %s", self.name, self.memory_limits.directory)
        else:
            log.info("worker %s: memory limits watched (each attempt's processes measured every %ss)", self.name, WATCH_INTERVAL)
        # The fork server holds nothing a task may not read: no password, no secret key; and it
        # is started with the task environment alone, its own settings sent over its socket.
        passthrough, deny = settings.ORCHESTRATOR_TASK_ENV_PASSTHROUGH, settings.ORCHESTRATOR_TASK_ENV_DENY
        launcher = Launcher(
            task_environment(os.environ, passthrough, deny),
            settings=fork_server_settings(os.environ, passthrough, deny),
            task_user=self.task_user,
        )
        launcher.start()  # warm before the first job: imports happen once, here
        if self.task_user is not None and launcher.confined:
            log.info("worker %s: each attempt confined to its own processes (Landlock): it signals and traces no other", self.name)
        elif self.task_user is not None:
            log.warning(
                "worker %s: attempts cannot be confined here (Landlock with signal scoping needs Linux 6.12): "
                "the task user's attempts can signal one another's processes",
                self.name,
            )
        heartbeats = Heartbeats(
            interval=float(settings.ORCHESTRATOR_HEARTBEAT_INTERVAL),
            timeout=float(settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT),
            outage_tolerance=float(settings.ORCHESTRATOR_DB_OUTAGE_TOLERANCE),
            holder=self.name,
            on_beat=self._rq_heartbeats,
            on_lease=launcher.keep_alive,
        )
        db = DatabasePool(DATABASE_CONNECTIONS)
        spool = Spool(Path(settings.ORCHESTRATOR_SPOOL_DIR), self.name)
        shared = WorkerRuntime(
            self.name, launcher, heartbeats, db, spool, offered_queues=self._offered_queues, hand_on=self._hand_on,
            memory_limits=self.memory_limits,
        )
        install(shared)
        launcher.keep_alive(heartbeats.lease_seconds)  # from the first job on, the fork server holds the lease
        heartbeats.start()
        stop_spool = threading.Event()
        spool_thread = threading.Thread(target=self._deliver_spooled, args=(shared, stop_spool), name="spool", daemon=True)
        spool_thread.start()
        keep = lambda: launcher.server_pids()  # noqa: E731  its own children, waited for by their Popen
        threading.Thread(target=procs.reap_orphans_forever, args=(keep, stop_spool), name="reaper", daemon=True).start()
        try:
            return super().work(*args, **kwargs)
        finally:
            install(None)
            stop_spool.set()
            spool_thread.join(timeout=5)
            heartbeats.stop()
            launcher.close()
            shared.db.close()
            spool.close()

    @staticmethod
    def _deliver_spooled(shared: WorkerRuntime, stop: threading.Event) -> None:
        """Deliver the reports the database could not take, as soon as it can."""
        while not stop.wait(SPOOL_INTERVAL):
            try:
                shared.spool.drain(lambda record: deliver_spooled(shared, record))
            except Exception:
                log.exception("could not deliver spooled reports; trying again")

    def register_birth(self) -> None:
        super().register_birth()
        # The operator pages and the API show how many attempts this worker runs at once.
        self.connection.hset(self.key, "concurrency", str(self.concurrency))
        self.connection.hset(self.key, "task_user", describe(self.task_user) or "")
        self.connection.hset(self.key, "memory_limits", self.memory_limits.mode)

    def teardown(self) -> None:
        # Stopping: every slot finishes its attempt (within the shutdown grace) before we go,
        # and so does any slot one of them handed its place to meanwhile.
        while self._slots:
            for thread in list(self._slots):
                thread.join()
        super().teardown()
        connections.close_all()

    def _install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._request_shutdown)
        signal.signal(signal.SIGINT, self._request_shutdown)
        signal.signal(signal.SIGUSR1, self._stop_taking_jobs)

    def _stop_taking_jobs(self, signum: int, frame: FrameType | None) -> None:
        """SIGUSR1 (a Kubernetes preStop hook sends it): take no new job, let the running tasks
        finish, then exit. Unlike SIGTERM it starts no shutdown grace, so the kubelet's SIGTERM
        that follows is still the first: it starts the grace, and a task it stops is reported
        `worker_termination` as always (a second SIGTERM would end the grace at once)."""
        if self._stop_requested:
            return
        self._stop_requested = True
        log.warning("worker %s: SIGUSR1; taking no new job, exiting when the running tasks end", self.name)
        if self._dequeuing or not self._slots:
            raise StopRequested()  # leave the blocking wait for a job or a slot at once

    def _request_shutdown(self, signum: int, frame: FrameType | None) -> None:
        name = signal_name(signum)
        again = SHUTDOWN.requested
        SHUTDOWN.request(name)
        self._stop_requested = True
        if again:
            log.warning("worker %s: %s again; stopping the running tasks now", self.name, name)
        else:
            log.warning("worker %s: %s; taking no new job, running tasks may go on for the shutdown grace", self.name, name)
        if self._dequeuing or not self._slots:
            raise StopRequested()  # leave the blocking wait for a job or a slot at once

    # --- RQ's own records -------------------------------------------------------------------------

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """RQ's heartbeat of the worker's key: in a pipeline of the caller's, or in one round trip
        of its own at most once every RQ_HEARTBEAT_EVERY (none while Redis is away: the
        heartbeat thread says so, and the next blocking pop waits for it as RQ's pop does)."""
        if pipeline is not None:
            super().heartbeat(timeout, pipeline=pipeline)
            return
        if time.monotonic() - self._rq_beat_at >= RQ_HEARTBEAT_EVERY:
            self._unless_redis_away(self._beat_rq, timeout)

    def check_for_suspension(self, burst: bool) -> None:
        """`rq suspend` honoured within SUSPENSION_CHECK_EVERY; Redis away is no reason to quit
        (see `heartbeat`)."""
        if time.monotonic() - self._suspension_checked_at < SUSPENSION_CHECK_EVERY:
            return
        self._unless_redis_away(super().check_for_suspension, burst)
        self._suspension_checked_at = time.monotonic()

    def run_maintenance_tasks(self) -> None:
        self._unless_redis_away(super().run_maintenance_tasks)

    def _unless_redis_away(self, record: Any, *args: Any) -> None:
        """Write one of RQ's records of this worker, unless Redis is away: then it is left out
        (the main loop goes on to its pop, which waits for Redis)."""
        try:
            record(*args)
        except REDIS_AWAY as exc:
            log.warning("worker %s: Redis is away (%s); RQ's records of this worker wait for it", self.name, exc)

    def _beat_rq(self, timeout: int | None = None) -> None:
        """RQ's heartbeat now, in one round trip (the heartbeat thread's: other workers judge
        this one's liveness by it)."""
        self._rq_beat_at = time.monotonic()
        with self.connection.pipeline(transaction=False) as pipe:
            super().heartbeat(timeout, pipeline=pipe)
            pipe.execute()

    def handle_execution_ended(self, job: Job, queue: Queue, heartbeat_ttl: int) -> None:
        """The job's end time, without RQ's extra beat of a job whose end it writes next, in one
        pipeline (RQ beats it to keep it alive through its success or failure callbacks: ours
        have none)."""
        job.ended_at = now()

    def set_state(self, state: str, pipeline: Any = None) -> None:
        """RQ says "idle" each time it waits for a job; while a slot still runs one the worker is
        busy, and stays so in RQ's records (one round trip fewer for every job)."""
        if state == WorkerStatus.IDLE and pipeline is None:
            with self._busy_lock:
                busy = bool(self._running or self._handed)
            if busy:
                return
        if pipeline is not None:
            super().set_state(state, pipeline=pipeline)
        else:
            self._unless_redis_away(super().set_state, state)

    # --- taking jobs ------------------------------------------------------------------------------

    @property
    def dequeue_timeout(self) -> int:
        return DEQUEUE_TIMEOUT

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> tuple[Job, Queue] | None:
        """Wait for a free slot, then for a job; None (stop) when a stop was requested meanwhile."""
        self._dequeuing = True
        try:
            while not self._free_slots.acquire(timeout=1.0):
                self.heartbeat()
            # With the database away a new job could not even be claimed: leave it in Redis.
            shared = runtime()
            while shared is not None and shared.db.unreachable and not self._stop_requested:
                self.heartbeat()
                if shared.db.reachable():
                    break
                time.sleep(1.0)
            if self._stop_requested:
                self._free_slots.release()
                return None
            result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        except BaseException:
            self._free_slots.release()
            raise
        finally:
            self._dequeuing = False
        if result is None:
            self._free_slots.release()
        return result

    def execute_job(self, job: Job, queue: Queue) -> None:
        """Start the job in a slot and return at once: the main loop goes back for the next."""
        execution: Execution | None = None
        if rqrecords.is_attempt(job):
            self._record_taken(job, queue)
        else:
            execution = self.prepare_execution(job)
        with self._busy_lock:
            self._running[job.id] = (job, execution)
        thread = threading.Thread(target=self._run_slot, args=(job, queue, execution), name=f"slot-{job.id}", daemon=True)
        self._slots.add(thread)
        thread.start()

    def _run_slot(self, job: Job, queue: Queue, execution: Execution | None) -> None:
        try:
            if execution is None:
                self._perform_attempt(job)
            else:
                self.perform_job(job, queue, execution)
        except Exception:
            log.exception("worker %s: job %s failed outside its task", self.name, job.id)
        finally:
            with self._busy_lock:
                self._running.pop(job.id, None)
            self._slot_ended()

    def _record_taken(self, job: Job, queue: Queue) -> None:
        """An attempt's job `started` by this worker, and the worker busy: one round trip. Redis
        gone since the pop: the attempt runs all the same (its claim is the database's)."""
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                rqrecords.record_taken(pipe, job, queue, self.name)
                if self._state != WorkerStatus.BUSY:
                    self.set_state(WorkerStatus.BUSY, pipeline=pipe)
                pipe.execute()
        except REDIS_AWAY as exc:
            log.warning("worker %s: could not record job %s as taken in RQ (%s)", self.name, job.id, exc)

    def _perform_attempt(self, job: Job) -> None:
        """Run an attempt's job, then record its end in one round trip. Its outcome is the
        database's; RQ keeps what the function returned, or its traceback if it raised (then the
        job is in RQ's failed registry, where the scheduler finds an attempt never claimed)."""
        try:
            return_value = job.perform()
        except Exception:
            job.ended_at = now()
            text = traceback.format_exc()
            log.error("worker %s: job %s raised outside its task\n%s", self.name, job.id, text)
            self._record_ended(job, lambda pipe: rqrecords.record_failed(pipe, job, text, self.name), succeeded=False)
        else:
            job.ended_at = now()
            self._record_ended(job, lambda pipe: rqrecords.record_finished(pipe, job, return_value, self.name), succeeded=True)

    def _record_ended(self, job: Job, record: Any, *, succeeded: bool) -> None:
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                record(pipe)
                if succeeded:
                    self.increment_successful_job_count(pipeline=pipe)
                else:
                    self.increment_failed_job_count(pipeline=pipe)
                if job.started_at is not None and job.ended_at is not None:
                    self.increment_total_working_time(job.ended_at - job.started_at, pipe)
                pipe.execute()
        except Exception:
            # The attempt's outcome is in the database already; only RQ's record of it is missing.
            log.warning("worker %s: could not record the end of job %s in RQ", self.name, job.id, exc_info=True)

    def _run_handed(self, claimed: Claimed, started: threading.Event) -> None:
        """A slot for the task another slot's report claimed for it (no RQ job exists for it);
        `started` is set once the task runs its code (or will not)."""
        try:
            run_claimed(claimed, handed=True, on_started=started.set)
        except Exception:
            log.exception("worker %s: task instance %s attempt %s failed outside its task", self.name, claimed.pk, claimed.attempt_token)
        finally:
            started.set()
            with self._busy_lock:
                self._handed.discard(threading.current_thread())
            self._slot_ended()

    def _slot_ended(self) -> None:
        """A slot's thread is done: its connection closed, its place freed (unless it handed the
        place to a task of its own report: then that task's slot frees it)."""
        close_old_connections()
        connection.close()  # a job that used the database in this thread (a deadline callback)
        with self._busy_lock:
            idle = not self._running and not self._handed
        if idle:
            try:
                self.set_state(WorkerStatus.IDLE)
            except Exception:
                pass
        self._slots.discard(threading.current_thread())
        if getattr(self._slot_local, "passed_on", False):
            self._slot_local.passed_on = False
        else:
            self._free_slots.release()

    # --- a slot's place handed to the next task (engine/handover.py) ------------------------------

    def _offered_queues(self) -> frozenset[str]:
        """The queues a slot ending its task may take the next one from: those it listens to that
        hold no job (one round trip), none while it is stopping or draining."""
        if self._stop_requested or SHUTDOWN.requested:
            return frozenset()
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                for queue in self.queues:
                    pipe.llen(queue.key)
                depths = pipe.execute()
        except Exception:
            return frozenset()  # Redis away: the report's jobs will not go either; nothing to take
        return frozenset(queue.name for queue, depth in zip(self.queues, depths) if depth == 0)

    def _hand_on(self, claimed: Claimed) -> None:
        """Called in a slot whose report claimed a task for it: run that task in a new slot
        thread, which takes over this slot's place (this one ends its RQ job once that task has
        started, or after HAND_ON_HEAD_START)."""
        started = threading.Event()
        thread = threading.Thread(
            target=self._run_handed, args=(claimed, started), name=f"slot-ti-{claimed.pk}-{claimed.attempt_token}", daemon=True
        )
        with self._busy_lock:
            self._handed.add(thread)
        self._slots.add(thread)
        try:
            thread.start()
        except BaseException:
            # No thread: the task stays claimed, and the scheduler finds it by its heartbeat.
            with self._busy_lock:
                self._handed.discard(thread)
            self._slots.discard(thread)
            raise
        self._slot_local.passed_on = True
        started.wait(HAND_ON_HEAD_START)

    def _rq_heartbeats(self) -> None:
        """Keep RQ's records of every running job alive (its registries, its dashboards)."""
        with self._busy_lock:
            running = list(self._running.values())
            idle = not self._running and not self._handed
        self._idle_trim.seen(idle)
        self._beat_rq()
        self._beat_attempt_jobs([job for job, execution in running if execution is None])
        for job, execution in running:
            if execution is not None:
                self.maintain_heartbeats(job, execution)
        if time.monotonic() - self._swept_at >= SWEEP_INTERVAL:
            # Cgroups an ended attempt could not remove at once, and those of workers that died.
            self._swept_at = time.monotonic()
            try:
                self.memory_limits.sweep()
            except Exception:
                log.warning("could not sweep the memory cgroups", exc_info=True)

    def _beat_attempt_jobs(self, jobs: list[Job]) -> None:
        """The running attempts' jobs' heartbeats, in one round trip (the scheduler reads one, of a
        job not yet claimed, to tell a live worker slow to claim it from a dead one)."""
        if not jobs:
            return
        with self.connection.pipeline(transaction=False) as pipe:
            positions = rqrecords.beat(pipe, jobs)
            replies = pipe.execute()
            if rqrecords.forget_recreated(pipe, jobs, positions, replies):
                pipe.execute()
