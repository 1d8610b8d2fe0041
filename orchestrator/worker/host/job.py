"""The RQ job the dispatcher enqueues: `run_task_instance(task_instance_id, token)`.

It claims the attempt (dropping the job if the attempt is no longer current), supervises the
task process, classifies what it saw and reports it, fenced by the attempt token throughout.
"""
from __future__ import annotations

import functools
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.db import InterfaceError, OperationalError

from orchestrator.data import metrics
from orchestrator.engine import claimgate, handover, leases, reporting, task_state_store, waits
from orchestrator.engine.reporting import Claimed, WorkerInfo
from orchestrator.foundation.clock import shared_now
from orchestrator.foundation.outputstore import output_store
from orchestrator.foundation.redis_conn import get_redis
from orchestrator.foundation.sanitise import error_text
from orchestrator.foundation.templating import RenderError, render
from orchestrator.worker import failpoints
from orchestrator.worker.classify import Outcome, Stop, Verdict, classify, db_connection_failure
from orchestrator.worker.host.report import Report, Rescheduled, Success, refused, report_of
from orchestrator.worker.host.runtime import WorkerRuntime, default_worker_name, runtime
from orchestrator.worker.host.shutdown import SHUTDOWN
from orchestrator.worker.host.spool import Retry
from orchestrator.worker.host.supervisor import Plan, Supervised, Supervisor, SupervisorSettings
from orchestrator.worker.task.runner import context_environment
from retries.states import Reason

log = logging.getLogger(__name__)


T = TypeVar("T")


def run_task_instance(task_instance_id: int, token: int) -> str:
    """Run one attempt of a task instance; returns what happened, for RQ's job result."""
    shared = runtime()
    if shared is None:
        raise RuntimeError("run_task_instance runs only in a worker started by run_worker")
    worker = worker_info()
    # With the database away the job waits here, charging nothing, for up to the outage tolerance.
    claim = lambda: shared.db.call(reporting.claim, task_instance_id, token, worker)  # noqa: E731
    ti = _with_db_retries(claim, patience=float(settings.ORCHESTRATOR_DB_OUTAGE_TOLERANCE))
    if ti is None:
        log.info("dropping job for task instance %s attempt %s: the attempt is no longer current", task_instance_id, token)
        return "stale"
    return run_claimed(ti)


def run_claimed(ti: Claimed, *, handed: bool = False, on_started: Callable[[], None] | None = None) -> str:
    """Run an attempt this worker claimed: from a job, or `handed` to it by its own report (then
    claimed in the transaction that dispatched it, past the same gate: not asked again).
    `on_started` is called once the task's code may run (its "go" sent, its command started)."""
    shared = runtime()
    if shared is None:
        raise RuntimeError("run_claimed runs only in a worker started by run_worker")
    worker = worker_info()
    token = ti.attempt_token
    if not handed and (ti.circuit or ti.queue) and _held(shared, ti):
        return "held"
    failpoints.fire(failpoints.WORKER_BEFORE_SPAWN, task_instance_id=ti.pk, task_id=ti.task_id)
    if SHUTDOWN.requested:
        # Stopping: start nothing new; another worker takes it on the platform budget.
        outcome = Outcome(handshake=False, stop=Stop(Reason.WORKER_TERMINATION, shutdown_signal=SHUTDOWN.signal), metadata=_metadata(worker))
        return _report(shared, ti.pk, token, classify(outcome), Supervised(superseded=False, outcome=outcome))
    if not ti.has_definition:
        outcome = Outcome(started=False, start_error="the task was removed from its DAG", metadata=_metadata(worker))
        return _report(shared, ti.pk, token, classify(outcome), Supervised(superseded=False, outcome=outcome))
    state = None
    if ti.python_callable:
        state = task_state_store.start_claimed(ti.pk, ti.dag_id, ti.run_id, ti.task_id, ti.task_state_epoch, ti.has_task_state)
    if ti.python_callable and state is None:
        load = lambda: shared.db.call(task_state_store.start, ti.pk, ti.dag_id, ti.run_id, ti.task_id)  # noqa: E731
        try:
            state = _with_db_retries(load, patience=float(settings.ORCHESTRATOR_DB_OUTAGE_TOLERANCE))
        except (OperationalError, InterfaceError):
            raise  # past the outage tolerance: the scheduler finds the claim gone stale
        except Exception as exc:
            # Refused for another reason: it would be the next time too. Nothing started.
            log.exception("task instance %s attempt %s: could not read its task state", ti.pk, token)
            outcome = Outcome(started=False, start_error=f"could not read its task state: {error_text(exc)}", metadata=_metadata(worker))
            return _report(shared, ti.pk, token, classify(outcome), Supervised(superseded=False, outcome=outcome))
    try:
        plan = plan_for(ti, state)
    except RenderError as exc:
        # Its command cannot be given its values (one holds a NUL, a template stands in single
        # quotes): nothing starts, and it is the task's to fix, whichever way it would start.
        outcome = Outcome(is_bash=True, started=False, unstartable=str(exc), metadata=_metadata(worker))
        return _report(shared, ti.pk, token, classify(outcome), Supervised(superseded=False, outcome=outcome))
    supervisor = Supervisor(
        plan,
        worker,
        supervisor_settings(),
        launcher=shared.launcher,
        heartbeats=shared.heartbeats,
        db=shared.db.call,
        passthrough=tuple(settings.ORCHESTRATOR_TASK_ENV_PASSTHROUGH),
        deny=tuple(settings.ORCHESTRATOR_TASK_ENV_DENY),
        keep_changes=shared.spool.keep_changes,
        task_state_max_bytes=int(settings.ORCHESTRATOR_TASK_STATE_MAX_BYTES),
        output_store=output_store(),
        on_started=on_started,
        memory_limits=shared.memory_limits,
    )
    try:
        supervised = supervisor.run()
    except Exception:
        # Nobody watches this attempt any more: let its lease go, so that the scheduler ends
        # it (lost) instead of it being kept alive for ever by this worker's heartbeat.
        shared.heartbeats.forget_attempt(ti.pk, token)
        raise
    try:
        return _report_supervised(shared, ti.pk, token, supervised)
    finally:
        supervised.finish()  # a success is reported before its process is over: reap it now


def _report_supervised(shared: WorkerRuntime, task_instance_id: int, token: int, supervised: Supervised) -> str:
    if supervised.superseded:
        shared.spool.keep_changes(task_instance_id, token, [])  # fenced out anyway
        shared.heartbeats.forget_attempt(task_instance_id, token)
        log.warning("task instance %s attempt %s was superseded; nothing reported", task_instance_id, token)
        return "superseded"
    return _report(shared, task_instance_id, token, classify(supervised.outcome), supervised)


def _held(shared: WorkerRuntime, ti: Claimed) -> bool:
    """Its circuit opened (or its queue was paused) since it was dispatched: it goes back to
    waiting, charged nothing, instead of calling a downstream known to be failing."""
    try:
        now = shared_now()
        hold = shared.db.call(claimgate.hold_at_claim, ti.pk, ti.attempt_token, ti.queue, ti.circuit, now)
        if hold is None:
            return False
        put_back = shared.db.call(claimgate.put_back, ti.pk, ti.attempt_token, hold, now)
    except Exception:
        log.warning("could not check the gate of task instance %s attempt %s; it runs", ti.pk, ti.attempt_token, exc_info=True)
        return False  # the gate is a courtesy: the claim stands, the task runs
    if put_back:
        log.info("task instance %s attempt %s: held at claim by %s %s; back to waiting", ti.pk, ti.attempt_token, hold.kind, hold.name)
    return put_back


def worker_info() -> WorkerInfo:
    shared = runtime()
    return WorkerInfo(hostname=_hostname(), worker_name=shared.name if shared else default_worker_name(), pid=os.getpid())


@functools.lru_cache(maxsize=1)
def _hostname() -> str:
    return socket.gethostname()


def supervisor_settings() -> SupervisorSettings:
    return SupervisorSettings(
        heartbeat_interval=float(settings.ORCHESTRATOR_HEARTBEAT_INTERVAL),
        heartbeat_timeout=float(settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT),
        shutdown_grace=float(settings.ORCHESTRATOR_WORKER_SHUTDOWN_GRACE),
        startup_timeout=float(settings.ORCHESTRATOR_HANDSHAKE_TIMEOUT),
        head_bytes=int(settings.ORCHESTRATOR_LOG_HEAD_BYTES),
        tail_bytes=int(settings.ORCHESTRATOR_LOG_TAIL_BYTES),
        db_outage_tolerance=float(settings.ORCHESTRATOR_DB_OUTAGE_TOLERANCE),
    )


def plan_for(claimed: Claimed, state: task_state_store.Start | None = None) -> Plan:
    """What the supervisor runs. Raises `RenderError` for a bash command that cannot be given its
    values: rendered here whichever way it starts, so that such a command starts no process."""
    context = {
        "dag_id": claimed.dag_id,
        "task_id": claimed.task_id,
        "run_id": claimed.run_id,
        "try_number": claimed.try_number,
        "infrastructure_try_number": claimed.infrastructure_try_number,
        "logical_date": claimed.logical_date.isoformat(),
        "conf": claimed.conf,
        "params": claimed.params,
        "map_index": claimed.map_index,
    }
    if state is not None:  # a Python task: its store (made live in the task process) and key
        context["task_state"] = state.entries
        context["idempotency_key"] = state.idempotency_key
    result_max_bytes = int(settings.ORCHESTRATOR_RESULT_MAX_BYTES)
    payload = {
        "task_instance_id": claimed.pk,
        "token": claimed.attempt_token,
        "task_id": claimed.task_id,
        "python_callable": claimed.python_callable,
        "bash_command": claimed.bash_command,
        # A mapped instance is called with its item by the name its `expand` gives it.
        "op_kwargs": {**claimed.op_kwargs, **claimed.mapped},
        "mapped": claimed.mapped,
        "context": context,
        "result_max_bytes": result_max_bytes,
        "task_state_max_bytes": int(settings.ORCHESTRATOR_TASK_STATE_MAX_BYTES),
        "task_state_max_keys": int(settings.ORCHESTRATOR_TASK_STATE_MAX_KEYS),
    }
    # A bash task is started directly (no Python in its process) unless a failpoint is set to
    # fire in its process.
    direct = bool(claimed.bash_command) and not failpoints.in_task_process(claimed.task_id)
    # Its values travel in its environment, never in its text (`orchestrator/foundation/templating.py`).
    rendered = render(claimed.bash_command, {**context, "results": claimed.results}, claimed.mapped) if claimed.bash_command else None
    return Plan(
        task_instance_id=claimed.pk,
        token=claimed.attempt_token,
        task_id=claimed.task_id,
        payload=payload,
        is_bash=bool(claimed.bash_command),
        execution_timeout=claimed.args.execution_timeout,
        kill_grace=claimed.args.kill_grace,
        result_max_bytes=result_max_bytes,
        command=("bash", "-c", rendered.command) if direct and rendered else None,
        command_env={**context_environment(context), **rendered.env} if direct and rendered else {},
        has_start_deadlines=claimed.has_start_deadlines,
        results_json=claimed.results_json,
        memory_limit_mib=claimed.memory_limit_mib,
    )


def _report(shared: WorkerRuntime, task_instance_id: int, token: int, verdict: Verdict, supervised: Supervised) -> str:
    """Deliver the outcome; if the database cannot take it within ORCHESTRATOR_REPORT_PATIENCE, spool it and
    let the worker deliver it later (the attempt keeps its lease until then)."""
    report = report_of(task_instance_id, token, verdict, supervised, shared_now())
    patience = float(settings.ORCHESTRATOR_REPORT_PATIENCE)
    # Only a success offers its slot: a failure's platform retry must not come back to a worker
    # that may be the cause of it.
    offer = _slot_offer(shared) if verdict.success else None
    try:
        try:
            described = _with_db_retries(lambda: deliver(shared, report, offer), patience=patience)
        except (OperationalError, InterfaceError):
            raise
        except Exception as exc:
            # The database answered but refused this report: its lease must not outlive it.
            log.exception("task instance %s attempt %s: the database refused its report", task_instance_id, token)
            report = refused(report, exc)
            described = _with_db_retries(lambda: deliver(shared, report, offer), patience=patience)
        if offer is not None and described == "stale":
            # Found already recorded: perhaps by a try whose commit was not heard of, which
            # then claimed the next task for this slot too.
            offer.taken = offer.taken or _unheard_claim(shared, offer)
    except (OperationalError, InterfaceError):
        try:
            path = shared.spool.put(report.to_json())
            shared.spool.keep_changes(task_instance_id, token, [])  # the spooled report carries them
        except OSError as exc:
            return _outcome_lost(shared, task_instance_id, token, exc)
        log.warning("task instance %s attempt %s: the database is unreachable; its outcome waits in %s", task_instance_id, token, path)
        return "spooled"
    except Exception as exc:
        # Not even the bare failure could be recorded: set it aside (seen on the workers page)
        # and let the lease go, so the scheduler ends the attempt instead of it running forever.
        try:
            shared.spool.set_aside(report.to_json(), f"{type(exc).__name__}: {exc}")
            shared.spool.keep_changes(task_instance_id, token, [])  # the set-aside report carries them
        finally:
            shared.heartbeats.forget_attempt(task_instance_id, token)
        log.exception("task instance %s attempt %s: its outcome cannot be recorded; set aside", task_instance_id, token)
        return "set aside"
    finally:
        if offer is not None and offer.taken is not None:
            shared.hand_on(offer.taken)  # the next task, claimed for this slot by the report
    shared.spool.keep_changes(task_instance_id, token, [])
    shared.heartbeats.forget_attempt(task_instance_id, token)
    return described


def _outcome_lost(shared: WorkerRuntime, task_instance_id: int, token: int, exc: OSError) -> str:
    """The database is away and the spool cannot keep the outcome (a full disk, a read-only
    volume, its permissions): the outcome is lost. Keeping the lease would leave the task
    `running` for ever, so it is let go: the scheduler presumes the attempt lost and retries it
    as the platform's failure, with why in its metadata (noted in Redis). Said loudly: a log
    line, a counter and the workers page."""
    why = f"the worker's spool cannot keep outcomes: {type(exc).__name__}: {exc}"
    log.error("task instance %s attempt %s: the database is unreachable and %s; its outcome is lost and it will be retried as the platform's", task_instance_id, token, why)
    metrics.increment(metrics.SPOOL_UNWRITABLE, worker_name=shared.name)
    try:
        client = get_redis()
        leases.note_lost(client, task_instance_id, token, why)
        client.hset(f"rq:worker:{shared.name}", mapping={"spool_error": why[:500], "spool_error_at": str(time.time())})
    except Exception:
        log.warning("could not note in Redis why the outcome of task instance %s attempt %s was lost", task_instance_id, token, exc_info=True)
    shared.heartbeats.forget_attempt(task_instance_id, token)
    return "lost: spool unusable"


def _unheard_claim(shared: WorkerRuntime, offer: handover.Offer) -> reporting.Claimed | None:
    """The task a report's try claimed for this slot in a commit the worker did not hear of, if
    that commit happened: run at once rather than left until the scheduler presumes this
    worker dead. Unknown (the database away again): left to the scheduler, as before."""
    holder = worker_info()
    try:
        claimed = offer.unheard(lambda pk, token: bool(shared.db.call(reporting.holds_claim, pk, token, holder)))
    except Exception:
        log.warning("could not check whether a task was claimed for this slot by a report it did not hear of", exc_info=True)
        return None
    if claimed is not None:
        log.info("task instance %s attempt %s: claimed for this slot by a report whose commit was not heard of; running it",
                 claimed.pk, claimed.attempt_token)  # fmt: skip
    return claimed


def _slot_offer(shared: WorkerRuntime) -> handover.Offer:
    """This slot's offer to run the next task its report dispatches (`engine/handover.py`)."""
    return handover.Offer(shared.offered_queues, functools.partial(reporting.claim_within, worker=worker_info()))


def deliver(shared: WorkerRuntime, report: Report, offer: handover.Offer | None = None) -> str:
    """Report one outcome, fenced by its attempt token; raises while the database is away.
    With an `offer`, a task a success's report dispatches may be given to the reporting slot."""
    ti_id, token, now, ending = report.task_instance_id, report.token, report.ended_at, report.ending
    output = {"stdout": report.output.stdout, "stderr": report.output.stderr, "output_truncated": report.output.truncated}
    memory = {"memory_limit_mib": report.memory.limit_mib, "peak_memory_mib": report.memory.peak_mib} if report.memory else {}
    if report.task_state_changes:
        # Kept while the database was away: stored before the outcome, fenced like it.
        shared.db.call(task_state_store.apply, ti_id, token, list(report.task_state_changes))
    if isinstance(ending, Success):
        won = shared.db.call(handover.call_offering, offer, reporting.report_success, ti_id, token, result=ending.result, now=now, **output, **memory)
        return "success" if won else "stale"
    if isinstance(ending, Rescheduled):
        step = shared.db.call(waits.report_reschedule, ti_id, token, ending.seconds, now=now, **output)
        return "stale" if step is None else ("rescheduled" if not step.timed_out else "timeout/wait_timeout -> failed")
    decision = shared.db.call(
        reporting.report_failure,
        ti_id,
        token,
        ending.context,
        fingerprint=ending.fingerprint,
        retry_after=ending.retry_after,
        error=ending.error,
        expected=ending.expected,
        now=now,
        **output,
        **memory,
    )
    if decision is None:
        return "stale"
    return f"{ending.context.category.value}/{ending.context.reason.value} -> {decision.next_state.value}"


def deliver_spooled(shared: WorkerRuntime, record: dict[str, Any]) -> bool:
    """The spool's delivery: True once the database took the report (or refused it as stale).
    The spooled JSON is read into a `Report` here, at the spool's boundary (a record that is none
    is refused: set aside). Raises while the database is unreachable. A report it refuses
    otherwise is delivered bare (`refused`), and if even that is refused the error is raised for the spool to set the
    file aside, the lease let go. An error that may pass (a statement timeout, a deadlock, a
    locked database) is retried (`Retry`) until the same one has lasted
    ORCHESTRATOR_SPOOL_REPEATED_ERROR_TOLERANCE: then it counts as a refusal."""
    attempt = (record["task_instance_id"], record["token"])
    try:
        report = Report.from_json(record)
        try:
            described = deliver(shared, report)
        except Exception as exc:
            if not _refused(shared, attempt, exc):
                raise
            log.exception("the database refused the spooled report of task instance %s attempt %s", *attempt)
            described = deliver(shared, refused(report, exc))
    except Retry:
        raise
    except Exception as exc:
        if not _refused(shared, attempt, exc):
            raise
        shared.spool.streaks.clear(attempt)
        shared.heartbeats.forget_attempt(*attempt)
        if isinstance(exc, (OperationalError, InterfaceError)):
            raise RepeatedError(error_text(exc)) from exc  # not "the database is away": set aside
        raise
    shared.spool.streaks.clear(attempt)
    shared.heartbeats.forget_attempt(*attempt)
    log.info("delivered the spooled report of task instance %s attempt %s: %s", *attempt, described)
    return True


class RepeatedError(Exception):
    """A spooled report's deliveries failed with the same error for the whole tolerance."""


def _refused(shared: WorkerRuntime, attempt: tuple[int, int], exc: Exception) -> bool:
    """Whether the database refused the delivery: an error that is no OperationalError, or one
    that is no lost connection but has repeated for ORCHESTRATOR_SPOOL_REPEATED_ERROR_TOLERANCE.
    Raises `Retry` for such an error until then; False for a lost connection."""
    if not isinstance(exc, (OperationalError, InterfaceError)):
        return True
    if isinstance(exc, InterfaceError) or db_connection_failure(exc)[0]:
        return False
    tolerance = float(settings.ORCHESTRATOR_SPOOL_REPEATED_ERROR_TOLERANCE)
    if shared.spool.streaks.failed(attempt, _error_kind(exc), tolerance):
        log.error("task instance %s attempt %s: its spooled report failed with %s for %.0fs; taken as refused", *attempt, exc, tolerance)
        return True
    raise Retry(error_text(exc)) from exc


def _error_kind(exc: BaseException) -> str:
    """What makes two errors the same: PostgreSQL's SQLSTATE (a deadlock's message names
    processes that differ every time), else the message."""
    sqlstate = getattr(exc.__cause__, "sqlstate", None) or getattr(exc.__cause__, "pgcode", None)
    return f"{type(exc).__name__} {sqlstate}" if sqlstate else error_text(exc)


def _metadata(worker: WorkerInfo) -> dict[str, str]:
    return {"worker_name": worker.worker_name, "hostname": worker.hostname}


def _with_db_retries(call: Callable[[], T], *, patience: float) -> T:
    """Call through a database blip: retry with backoff for up to `patience` seconds."""
    deadline = time.monotonic() + patience
    delay = 0.5
    while True:
        try:
            return call()
        except (OperationalError, InterfaceError):
            if time.monotonic() + delay > deadline:
                raise
            log.warning("the database did not answer; retrying in %.1fs", delay, exc_info=True)
            time.sleep(delay)
            delay = min(delay * 2, 8.0)
