"""The audit log's one writer: who did what to which run or task, with the prior and new state.

Below the engine, so an operator's action (`actions.py`), the admin, and the scheduler's own
operator-like steps (a backfill re-running a finished run) all write it the same way.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from orchestrator.data import sql
from orchestrator.models import AuditLog

User = AbstractBaseUser | AnonymousUser | None


def username_of(user: User) -> str:
    if user is None or not getattr(user, "is_authenticated", False):
        return ""
    return user.get_username()


def audit(
    user: User,
    action: str,
    dag_id: str,
    run_id: str,
    task_id: str,
    prior_state: str,
    new_state: str,
    details: dict[str, Any],
    *,
    username: str = "",
) -> AuditLog:
    """One audit row. `username` names who acted when no logged-in user did (the CLI's OS user,
    a backfill's creator). Its time is the shared clock's (the model's default), which the
    engine's times are compared with."""
    entry = AuditLog(
        user_id=user.pk if user is not None and user.is_authenticated else None,
        username=username_of(user) or username[:150],
        action=action,
        dag_id=dag_id,
        run_id=run_id,
        task_id=task_id,
        prior_state=str(prior_state),
        new_state=str(new_state),
        details=details,
    )
    sql.insert(entry)
    return entry


def audit_many(
    user: User, action: str, dag_id: str, run_id: str, task_id: str, rows: Iterable[tuple[str, str, dict[str, Any]]]
) -> list[AuditLog]:
    """`audit()` of one action on many instances of a task at once, one row each (prior state,
    new state, details), written by one INSERT."""
    user_id = user.pk if user is not None and user.is_authenticated else None
    return AuditLog.objects.bulk_create([
        AuditLog(
            user_id=user_id,
            username=username_of(user),
            action=action,
            dag_id=dag_id,
            run_id=run_id,
            task_id=task_id,
            prior_state=str(prior_state),
            new_state=str(new_state),
            details=details,
        )
        for prior_state, new_state, details in rows
    ])
