"""Where the engine tells the deadlines app that a run or task reached a reference point.

Each function runs inside the engine's transaction, so a deadline exists exactly when the
state change that created it does.
"""
from __future__ import annotations

from datetime import datetime


def run_created(dag_run, now: datetime) -> None:
    """A run was queued: create its DAG-level deadlines."""


def task_queued(task_instance, now: datetime) -> None:
    """A task was dispatched: create its task_queued_at deadlines (first dispatch only)."""


def task_started(task_instance, now: datetime) -> None:
    """A task reported running: create its task_started_at deadlines (first start only)."""


def task_finished(task_instance, now: datetime) -> None:
    """A task reached a final state: resolve its task-level deadlines."""


def run_finished(dag_run, now: datetime) -> None:
    """A run reached success or failed: resolve its DAG-level deadlines."""
