"""The promises every fault test and the soak run check, in one place.

    violations(runs, records=...)   -> list of human-readable violations (empty: all kept)
    assert_invariants(runs, ...)    -> fails with every violation listed

- **no task lost / none stuck**: once the system has settled, every task instance is finished
  (success, failed, upstream_failed, skipped, removed) or dead_letter; none is left none,
  scheduled, up_for_retry, queued or running; every attempt row is finished (no attempt left
  queued or running behind a newer one), and the run is finished unless it waits on a
  dead letter.
- **none run twice at once**: tasks of the fault suite record, in a JSON-lines file, every
  start, a tick every ~0.1 s while alive, and the end, with their pid and attempt
  (try_number, infrastructure_try_number); no two attempts of one task instance may overlap in
  time, and no attempt may see an earlier copy of itself still alive when it starts or ticks.
- **budgets charged right**: every attempt's kind, category and reason agree with the retry
  rules: an infrastructure failure is charged to the platform (kind `platform`) while the
  platform budget lasts and only then to the user; application and timeout failures are
  `user`; a platform failure never increases the user try (the next dispatch keeps
  `try_number`, `infrastructure_try_number` + 1); a user failure adds one user try; the task's
  counters agree with its attempts; at most one attempt succeeded.
- **no remote job submitted twice**: for a resumable task (`orchestrator.resumable.RemoteJob`),
  the job service saw at most one job per idempotency key (one task instance, until a clear
  empties its task state) unless the one before it had already ended failed (or cancelled)
  when the next was submitted. `remote_jobs` is the job service's ledger: each job's key, id,
  state, `submitted_at` and `ended_at`.
"""
from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.models import DagRun, TaskAttempt, TaskInstance
from retries.states import CATEGORY_OF_REASON, FINISHED_TASK_STATES, AttemptKind, Category, Reason, TaskState

SETTLED_TASK_STATES = frozenset(str(s) for s in FINISHED_TASK_STATES) | {str(TaskState.DEAD_LETTER)}
FINISHED_ATTEMPT_STATES = frozenset({TaskAttempt.State.SUCCESS, TaskAttempt.State.FAILED})
# How far apart two records of one attempt may be and still count as "alive in between".
TICK_SLACK = 0.0


@dataclass(frozen=True)
class Interval:
    key: tuple[str, str, str]  # dag_id, run_id, task_id
    pid: int
    attempt: str  # "try.infra"
    start: float
    last_seen: float
    ended: bool
    saw_others_alive: tuple[int, ...]


# --- records written by the tasks -------------------------------------------------------------


def read_records(paths: Iterable[str | os.PathLike]) -> list[dict]:
    records = []
    for path in paths:
        path = Path(path)
        files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
        for file in files:
            if not file.exists():
                continue
            for line in file.read_text().splitlines():
                line = line.strip()
                if not line:
                    continue
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue  # a line cut by a SIGKILL mid-write
    return records


def intervals(records: Iterable[dict]) -> list[Interval]:
    """One interval per (task instance, pid): from its start to the last time it was seen."""
    by_pid: dict[tuple, dict] = {}
    for r in records:
        key = (r["dag_id"], r["run_id"], r["task_id"])
        ident = (key, r["pid"])
        entry = by_pid.setdefault(ident, {"start": None, "last": r["at"], "ended": False, "attempt": r.get("attempt"), "others": set()})
        if r["event"] == "start":
            entry["start"] = r["at"] if entry["start"] is None else min(entry["start"], r["at"])
        entry["last"] = max(entry["last"], r["at"])
        if r["event"] == "end":
            entry["ended"] = True
        entry["others"].update(r.get("others_alive") or ())
    out = []
    for (key, pid), e in by_pid.items():
        start = e["start"] if e["start"] is not None else e["last"]
        out.append(Interval(key, pid, e["attempt"], start, e["last"], e["ended"], tuple(sorted(e["others"]))))
    return out


def overlap_violations(records: Iterable[dict]) -> list[str]:
    problems = []
    by_key: dict[tuple, list[Interval]] = defaultdict(list)
    for interval in intervals(records):
        by_key[interval.key].append(interval)
    for key, spans in by_key.items():
        spans.sort(key=lambda s: s.start)
        for i, a in enumerate(spans):
            if a.saw_others_alive:
                problems.append(f"{'/'.join(key)}: attempt {a.attempt} (pid {a.pid}) saw earlier copies alive: {list(a.saw_others_alive)}")
            for b in spans[i + 1 :]:
                if b.start < a.last_seen - TICK_SLACK:
                    problems.append(
                        f"{'/'.join(key)}: attempts {a.attempt} (pid {a.pid}, {a.start:.2f}-{a.last_seen:.2f}) and "
                        f"{b.attempt} (pid {b.pid}, from {b.start:.2f}) ran at the same time"
                    )
    return problems


# --- the database -----------------------------------------------------------------------------


def _category(context: dict | None) -> str | None:
    return (context or {}).get("category")


def _reason(context: dict | None) -> str | None:
    return (context or {}).get("reason")


def _success_problems(a: TaskAttempt, where: str) -> list[str]:
    problems = []
    if a.context is not None:
        problems.append(f"{where}: a success with a failure context {a.context}")
    if a.kind != AttemptKind.USER:
        problems.append(f"{where}: a success of kind {a.kind}")
    return problems


def _failure_problems(a: TaskAttempt, where: str, limit: int, operator_actions: bool) -> list[str]:
    """A failed attempt: its reason's category, and the budget it was charged to."""
    category, reason = _category(a.context), _reason(a.context)
    if category is None or reason is None:
        return [f"{where}: failed without a context"]
    problems = []
    try:
        expected_category = CATEGORY_OF_REASON[Reason(reason)].value
    except ValueError:
        expected_category = None
        problems.append(f"{where}: unknown reason {reason!r}")
    if expected_category is not None and expected_category != category:
        problems.append(f"{where}: reason {reason} is {expected_category}, recorded as {category}")
    if category == Category.USER_ACTION and not operator_actions:
        problems.append(f"{where}: a user_action context with no operator action")
    if a.kind == AttemptKind.PLATFORM:
        if category != Category.INFRASTRUCTURE:
            problems.append(f"{where}: {category}/{reason} charged to the platform")
        if a.infrastructure_try_number >= limit:
            problems.append(f"{where}: charged to the platform with its budget ({limit}) spent")
    elif category == Category.INFRASTRUCTURE and a.infrastructure_try_number < limit and reason != Reason.OPERATOR_RECLASSIFIED:
        problems.append(f"{where}: infrastructure/{reason} charged to the user while the platform budget lasts ({a.infrastructure_try_number} of {limit})")
    return problems


def _sequence_problems(previous: TaskAttempt | None, a: TaskAttempt, where: str) -> list[str]:
    """The (try, platform try) an attempt was dispatched at, from the attempt before it."""
    if previous is None:
        return [] if (a.try_number, a.infrastructure_try_number) == (1, 0) else [f"{where}: the first dispatch should be (try 1, platform 0)"]
    if previous.state not in FINISHED_ATTEMPT_STATES:
        return []
    if previous.state == TaskAttempt.State.SUCCESS:
        return [f"{where}: dispatched again after a success"]
    at = f"(try {previous.try_number}, platform {previous.infrastructure_try_number})"
    if previous.kind == AttemptKind.PLATFORM:
        expected = (previous.try_number, previous.infrastructure_try_number + 1)
        kind = "platform"
    else:
        expected = (previous.try_number + 1, previous.infrastructure_try_number)
        kind = "user"
    if (a.try_number, a.infrastructure_try_number) != expected:
        return [f"{where}: after a {kind} failure at {at} expected (try {expected[0]}, platform {expected[1]})"]
    return []


def _settled_problems(ti: TaskInstance, attempts: list[TaskAttempt], label: str) -> list[str]:
    """A settled task's counters against its attempts."""
    problems = []
    last = attempts[-1]
    if ti.try_number != last.try_number:
        problems.append(f"{label}: task try_number {ti.try_number} but its last attempt was try {last.try_number}")
    platform_spent = sum(1 for a in attempts if a.kind == AttemptKind.PLATFORM and a.state == TaskAttempt.State.FAILED)
    if ti.infrastructure_try_number != platform_spent:
        problems.append(f"{label}: infrastructure_try_number {ti.infrastructure_try_number} but {platform_spent} platform attempts")
    if ti.try_number > ti.max_tries:
        problems.append(f"{label}: try {ti.try_number} beyond max_tries {ti.max_tries}")
    return problems


def attempt_violations(ti: TaskInstance, attempts: list[TaskAttempt], *, operator_actions: bool = False, settled: bool = True) -> list[str]:
    """The budget rules, attempt by attempt, for one task instance."""
    label = f"{ti.dag_run.dag.dag_id}/{ti.dag_run.run_id}/{ti.task_id}"
    problems = []
    limit = ti.infrastructure_retry_limit
    successes = 0
    previous: TaskAttempt | None = None
    tokens = [a.attempt_token for a in attempts]
    if tokens != sorted(set(tokens)):
        problems.append(f"{label}: attempt tokens not unique and increasing: {tokens}")
    if settled and attempts and attempts[-1].attempt_token != ti.attempt_token:
        problems.append(f"{label}: task is at attempt token {ti.attempt_token} but its newest attempt row is {attempts[-1].attempt_token}")
    for a in attempts:
        where = f"{label} attempt {a.attempt_token} (try {a.try_number}, platform try {a.infrastructure_try_number})"
        if a.state not in FINISHED_ATTEMPT_STATES:
            problems.append(f"{where}: left {a.state}")
            previous = a
            continue
        if a.state == TaskAttempt.State.SUCCESS:
            successes += 1
            problems += _success_problems(a, where)
        else:
            problems += _failure_problems(a, where, limit, operator_actions)
        if not operator_actions:
            problems += _sequence_problems(previous, a, where)
        previous = a
    if successes > 1:
        problems.append(f"{label}: {successes} attempts succeeded")
    if settled and attempts and not operator_actions:
        problems += _settled_problems(ti, attempts, label)
    if successes and ti.state != TaskState.SUCCESS and not operator_actions:
        problems.append(f"{label}: an attempt succeeded but the task is {ti.state}")
    if ti.state == TaskState.SUCCESS and successes != 1:
        problems.append(f"{label}: success with {successes} successful attempts")
    if ti.state == TaskState.FAILED and attempts and not operator_actions:
        last = attempts[-1]
        reason = _reason(last.context)
        if last.kind != AttemptKind.USER:
            problems.append(f"{label}: failed although its last attempt was charged to the platform")
        elif reason not in (Reason.NON_RETRYABLE, Reason.POISONED) and last.try_number < ti.max_tries:
            problems.append(f"{label}: failed at try {last.try_number} of {ti.max_tries} ({reason})")
    return problems


def state_violations(run: DagRun, tis: list[TaskInstance]) -> list[str]:
    problems = []
    for ti in tis:
        if ti.state not in SETTLED_TASK_STATES:
            problems.append(f"{run.dag.dag_id}/{run.run_id}/{ti.task_id}: stuck in {ti.state} (token {ti.attempt_token})")
    dead = any(ti.state == TaskState.DEAD_LETTER for ti in tis)
    if run.state not in ("success", "failed") and not dead:
        problems.append(f"{run.dag.dag_id}/{run.run_id}: run stuck in {run.state}")
    if dead and run.state != "running":
        problems.append(f"{run.dag.dag_id}/{run.run_id}: run {run.state} while a task is dead-lettered")
    return problems


def violations(
    runs: Iterable[DagRun],
    records: Iterable[str | os.PathLike] = (),
    *,
    settled: bool = True,
    operator_actions: bool = False,
    remote_jobs: Iterable[dict] = (),
) -> list[str]:
    """Every broken promise over `runs` (and the task records under `records`, and the job
    service's ledger `remote_jobs`)."""
    problems: list[str] = []
    run_ids = [r.pk for r in runs]
    all_runs = {r.pk: r for r in DagRun.objects.filter(pk__in=run_ids).select_related("dag")}
    tis_by_run: dict[int, list[TaskInstance]] = defaultdict(list)
    tis = list(TaskInstance.objects.filter(dag_run_id__in=run_ids).select_related("dag_run", "dag_run__dag"))
    for ti in tis:
        tis_by_run[ti.dag_run_id].append(ti)
    attempts_by_ti: dict[int, list[TaskAttempt]] = defaultdict(list)
    for a in TaskAttempt.objects.filter(task_instance__dag_run_id__in=run_ids).order_by("task_instance_id", "attempt_token"):
        attempts_by_ti[a.task_instance_id].append(a)
    for run_pk, run in all_runs.items():
        if settled:
            problems += state_violations(run, tis_by_run[run_pk])
    for ti in tis:
        attempts = attempts_by_ti[ti.pk]
        if not settled:
            attempts = [a for a in attempts if a.attempt_token != ti.attempt_token or a.state in FINISHED_ATTEMPT_STATES]
        problems += attempt_violations(ti, attempts, operator_actions=operator_actions, settled=settled)
    problems += overlap_violations(read_records(records))
    problems += remote_job_violations(remote_jobs)
    return problems


ENDED_FAILED = frozenset({"failed", "cancelled"})


def remote_job_violations(jobs: Iterable[dict]) -> list[str]:
    """A job submitted under a key whose previous job had not (yet) ended failed."""
    by_key: dict[str, list[dict]] = defaultdict(list)
    for job in jobs:
        by_key[job["key"]].append(job)
    problems = []
    for key, submitted in by_key.items():
        submitted.sort(key=lambda job: job["submitted_at"])
        for before, job in zip(submitted, submitted[1:]):
            ended_failed = before["state"] in ENDED_FAILED and before["ended_at"] is not None and before["ended_at"] <= job["submitted_at"]
            if not ended_failed:
                problems.append(
                    f"remote job {job['id']} was submitted under key {key} while job {before['id']} of the same key"
                    f" was {before['state']} (ended at {before['ended_at']}, next submitted at {job['submitted_at']})"
                )
    return problems


def assert_invariants(runs: Iterable[DagRun], records: Iterable[str | os.PathLike] = (), **kwargs) -> None:
    found = violations(list(runs), records, **kwargs)
    assert not found, f"{len(found)} invariant violation(s):\n" + "\n".join(found)


def attempts_of(ti: TaskInstance) -> list[tuple[str, str, str | None, int, int]]:
    """(kind, state, reason, try_number, infrastructure_try_number) per attempt, oldest first."""
    return [
        (a.kind, a.state, _reason(a.context), a.try_number, a.infrastructure_try_number)
        for a in ti.attempts.order_by("attempt_token")
    ]
