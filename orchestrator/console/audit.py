"""The audit log as it is read: one filter and one query for the audit page, `GET /api/v1/audit`
and `orchestrator audit`, so the three always show the same entries.

The parameters are declared once (`PARAMS`, `querystring.Param`s): the API documents and
checks them with these declarations, the page and the command parse with them, and a bad value
is a BadRequest naming the parameter whichever reads it. Entries come newest first; `limit`
bounds what is shown, and the count says how many match.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.http import QueryDict

from orchestrator.foundation.querystring import DEFAULT_LIMIT, LIMIT, Param, read_query, since, string
from orchestrator.models import AuditLog
from orchestrator.operations.documents import iso

PARAMS: tuple[Param, ...] = (
    string("dag_id", "Only entries of this DAG."),
    string("run_id", "Only entries of this run."),
    string("task_id", "Only entries of this task."),
    string("action", "Only this action: trigger, clear, mark_success, mark_failed, reclassify, circuit_open, backfill_create, ..."),
    string("user", "Only entries of what this user did."),
    since("Only entries written at or after this ISO 8601 date or date-time (naive means UTC)."),
    LIMIT,
)


@dataclass(frozen=True)
class AuditFilter:
    dag_id: str = ""
    run_id: str = ""
    task_id: str = ""
    action: str = ""
    user: str = ""
    since: datetime | None = None
    limit: int = DEFAULT_LIMIT

    def as_params(self) -> dict[str, str]:
        """The filter as query parameters (what the page's form shows), the empty ones left out."""
        params = {"dag_id": self.dag_id, "run_id": self.run_id, "task_id": self.task_id, "action": self.action, "user": self.user}
        if self.since is not None:
            params["since"] = self.since.isoformat()
        return {name: value for name, value in params.items() if value}


def parse(params: QueryDict | dict[str, str]) -> AuditFilter:
    """The filter from query parameters (or the command's options, by the same names);
    BadRequest naming a bad one."""
    if not isinstance(params, QueryDict):
        query = QueryDict(mutable=True)
        query.update({name: value for name, value in params.items() if value is not None})
        params = query
    return AuditFilter(**read_query(params, PARAMS))


def entries(audit_filter: AuditFilter) -> QuerySet[AuditLog]:
    """The entries the filter matches, newest first (not yet limited)."""
    rows = AuditLog.objects.all()
    for name in ("dag_id", "run_id", "task_id", "action"):
        value = getattr(audit_filter, name)
        if value:
            rows = rows.filter(**{name: value})
    if audit_filter.user:
        rows = rows.filter(username=audit_filter.user)
    if audit_filter.since is not None:
        rows = rows.filter(at__gte=audit_filter.since)
    return rows.order_by("-at", "-id")


@dataclass(frozen=True)
class Page:
    count: int  # every entry the filter matches
    rows: list[AuditLog]  # the newest `limit` of them


def page(audit_filter: AuditFilter) -> Page:
    rows = entries(audit_filter)
    return Page(rows.count(), list(rows[: audit_filter.limit]))


def map_index(entry: AuditLog) -> int | None:
    """The instance acted on: a mapped task's map_index, -1 for a task that is not mapped,
    null for an entry about no task (a trigger, a circuit, a backfill)."""
    if not entry.task_id:
        return None
    value = (entry.details or {}).get("map_index", -1)
    return value if isinstance(value, int) else -1


def document(entry: AuditLog) -> dict[str, Any]:
    """One entry as the API and `audit --json` serve it."""
    details = entry.details or {}
    note = details.get("note")
    return {
        "at": iso(entry.at),
        "user": entry.username or None,
        "action": entry.action,
        "dag_id": entry.dag_id,
        "run_id": entry.run_id,
        "task_id": entry.task_id,
        "map_index": map_index(entry),
        "prior_state": entry.prior_state,
        "new_state": entry.new_state,
        "note": note if isinstance(note, str) else "",
        "details": details,
    }


def line(entry: AuditLog) -> str:
    """One entry on one line, for `orchestrator audit`: when, who, what, where, the state it
    moved from and to, and the note (as JSON text, so a note's newline stays on the line)."""
    doc = document(entry)
    task = doc["task_id"] + (f"[{doc['map_index']}]" if (doc["map_index"] or -1) >= 0 else "")
    where = "/".join(part for part in (doc["dag_id"], doc["run_id"], task) if part) or details_subject(entry)
    words = [doc["at"], doc["user"] or "-", doc["action"], where or "-", f"{doc['prior_state'] or '-'}->{doc['new_state'] or '-'}"]
    if doc["note"]:
        words.append(f"note={json.dumps(doc['note'], ensure_ascii=False)}")
    return " ".join(words)


def details_subject(entry: AuditLog) -> str:
    """What an entry about no DAG acted on: a circuit (`circuit:NAME`), or nothing."""
    circuit = (entry.details or {}).get("circuit")
    return f"circuit:{circuit}" if circuit else ""
