"""The periodic deadline check: one pass over what is due, called by the scheduler loop.

`check_due(now, limit)` is the step; run_scheduler calls it every
ORCHESTRATOR_DEADLINE_CHECK_INTERVAL seconds, and again at once while it returns a full batch.
It works purely from need_by and whether the run or task has finished, so a deadline is
caught whatever its task is doing: blocked, running, retrying or never scheduled.

Several schedulers may check at once. Every claim is a conditional update, so a deadline is
missed (and its callback queued) exactly once; on PostgreSQL the due rows are also claimed
with SELECT ... FOR UPDATE SKIP LOCKED, so two checkers split a backlog instead of racing.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import QuerySet

from deadlines import queueing, risk
from deadlines.conf import int_setting, setting
from deadlines.models import OPEN_STATES, Deadline
from deadlines.resolution import after_misses, mark_missed_batch, settle_finished
from orchestrator.foundation.redis_conn import job_statuses
from retries.states import FINISHED_RUN_STATES, FINISHED_TASK_STATES

log = logging.getLogger(__name__)

# RQ job statuses meaning "still on its way to a worker".
WAITING_JOB_STATUSES = frozenset({"queued", "deferred", "scheduled"})


def check_due(now: datetime, limit: int = 500) -> int:
    """Mark due deadlines missed (exactly once) and queue their callbacks; return how many.

    The return value counts the due rows handled in this batch: `limit` means more may be
    waiting. Once the backlog is drained, the same call also re-dispatches callbacks whose
    retry is due (or whose job went missing) and raises early warnings.
    """
    handled = settle_due(now, limit)
    if handled < limit:
        for step in (watch_callbacks, warn_at_risk):
            try:
                step(now, limit)
            except Exception:
                log.exception("deadline check step %s failed; continuing", step.__name__)
    return handled


# --- misses ------------------------------------------------------------------------------------


def due_query(now: datetime) -> QuerySet[Deadline]:
    """Open deadlines whose need-by has passed, soonest first: an ordered scan of the partial
    index `deadline_due` that stops at the batch size."""
    return Deadline.objects.filter(state__in=OPEN_STATES, need_by__lte=now).order_by("need_by")


def claim_query(now: datetime, limit: int) -> QuerySet[Deadline]:
    """One batch of due rows; on PostgreSQL locked, and rows another checker holds skipped."""
    rows = due_query(now)
    if connection.vendor == "postgresql":
        rows = rows.select_for_update(skip_locked=True, of=("self",))
    return rows.select_related("dag_run__dag", "task_instance")[:limit]


def settle_due(now: datetime, limit: int) -> int:
    with transaction.atomic():
        rows = list(claim_query(now, limit))
        unfinished = []
        for deadline in rows:
            finished_at = _finished_at(deadline)
            if finished_at is None:
                unfinished.append(deadline)
            else:
                # Finished, but the engine did not settle it (it predates the deadline, say).
                settle_finished([deadline], finished_at)
        after_misses(mark_missed_batch(unfinished, now))
    return len(rows)


def _finished_at(deadline: Deadline) -> datetime | None:
    """When the run (or task) the deadline watches finished, or None while it is unfinished."""
    ti = deadline.task_instance
    if ti is not None:
        if ti.state in FINISHED_TASK_STATES:
            return ti.end_date or deadline.need_by
        return None
    run = deadline.dag_run
    if run.state in FINISHED_RUN_STATES:
        return run.end_date or deadline.need_by
    return None


# --- callback retries and lost callback jobs ---------------------------------------------------


def watch_callbacks(now: datetime, limit: int) -> int:
    """Dispatch again each miss callback whose retry is due, whose job vanished from Redis, or
    whose worker went quiet mid-call; give up after ORCHESTRATOR_DEADLINE_CALLBACK_ATTEMPTS."""
    rows = list(
        Deadline.objects.filter(
            callback_state__in=[Deadline.CallbackState.QUEUED, Deadline.CallbackState.RUNNING], callback_next_at__lte=now
        ).order_by("callback_next_at")[:limit]
    )
    if not rows:
        return 0
    statuses = _job_statuses(rows)
    attempts = int_setting("ORCHESTRATOR_DEADLINE_CALLBACK_ATTEMPTS")
    lease = timedelta(seconds=float(setting("ORCHESTRATOR_DEADLINE_CALLBACK_QUEUE_LEASE")))
    dispatched = 0
    with transaction.atomic():
        jobs: list[queueing.CallbackJob] = []
        for d in rows:
            status = statuses.get(d.pk)
            same = Deadline.objects.filter(
                pk=d.pk, callback_state=d.callback_state, callback_attempts=d.callback_attempts, callback_next_at=d.callback_next_at
            )
            if d.callback_state == Deadline.CallbackState.QUEUED and status in WAITING_JOB_STATUSES:
                same.update(callback_next_at=now + lease)  # workers are busy: wait longer
                continue
            if d.callback_state == Deadline.CallbackState.QUEUED and status == "started":
                continue  # the job is recording its outcome right now
            error = d.callback_error
            if d.callback_state == Deadline.CallbackState.RUNNING:
                error = f"dispatch {d.callback_attempts} of {attempts}: the worker stopped answering during the call"
            elif status != "finished":
                error = f"dispatch {d.callback_attempts} of {attempts}: callback job lost (job status {status or 'missing'})"
            if d.callback_attempts >= attempts:
                same.update(callback_state=Deadline.CallbackState.FAILED, callback_next_at=None, callback_error=error)
                continue
            won = same.update(
                callback_state=Deadline.CallbackState.QUEUED,
                callback_attempts=d.callback_attempts + 1,
                callback_next_at=now + lease,
                callback_error=error,
            )
            if won:
                jobs.append(queueing.job_for(d, queueing.MISSED, d.callback_attempts + 1))
                dispatched += 1
        queueing.enqueue_on_commit(jobs)
    return dispatched


def _job_statuses(rows: list[Deadline]) -> dict[int, str | None]:
    """The RQ status of each row's current job (None when Redis has no such job)."""
    try:
        statuses = job_statuses([queueing.job_id_for(d.pk, queueing.MISSED, d.callback_attempts) for d in rows])
    except Exception:
        log.warning("could not read callback job statuses from Redis; trying again next pass", exc_info=True)
        # Pretend every job is still waiting: never dispatch twice because Redis hiccuped.
        return {d.pk: "queued" for d in rows}
    return {d.pk: status for d, status in zip(rows, statuses)}


# --- early warning ---------------------------------------------------------------------------


def warn_at_risk(now: datetime, limit: int) -> int:
    """Mark `at_risk` (once) each pending warn deadline whose run probably cannot make it, and
    queue its callback with at_risk: true. Soonest need-by first (index `deadline_warn`)."""
    rows = list(
        Deadline.objects.filter(state=Deadline.State.PENDING, warn=True, need_by__gt=now)
        .select_related("dag_run__dag", "task_instance__definition")
        .order_by("need_by")[:limit]
    )
    run_estimates: dict[int, float | None] = {}
    warned = 0
    with transaction.atomic():
        jobs: list[queueing.CallbackJob] = []
        for d in rows:
            estimate = _estimate(d, now, run_estimates)
            if estimate is None or (d.need_by - now).total_seconds() >= estimate:
                continue
            won = Deadline.objects.filter(pk=d.pk, state=Deadline.State.PENDING).update(
                state=Deadline.State.AT_RISK, warned_at=now, warn_callback_state=Deadline.CallbackState.QUEUED
            )
            if won:
                d.state, d.warned_at = Deadline.State.AT_RISK, now
                log.info(
                    "deadline at risk: dag %s run %s%s needs ~%.0fs, %.0fs left",
                    d.dag_run.dag.dag_id, d.dag_run.run_id, f" task {d.task_id}" if d.task_id else "",
                    estimate, (d.need_by - now).total_seconds(),
                )
                extra = {"estimate": round(estimate, 3)} if estimate != float("inf") else {}
                jobs.append(queueing.job_for(d, queueing.AT_RISK, 1, **extra))
                warned += 1
        queueing.enqueue_on_commit(jobs)
    return warned


def _estimate(d: Deadline, now: datetime, run_estimates: dict[int, float | None]) -> float | None:
    if d.task_instance_id is not None:
        ti = d.task_instance
        if ti is None or ti.state in FINISHED_TASK_STATES:
            return None
        return risk.estimate_task(ti, d.dag_run.dag_id, now)
    if d.dag_run.state in FINISHED_RUN_STATES:
        return None
    if d.dag_run_id not in run_estimates:
        run_estimates[d.dag_run_id] = risk.estimate_run(d.dag_run, now)
    return run_estimates[d.dag_run_id]
