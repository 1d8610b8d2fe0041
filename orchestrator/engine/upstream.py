"""The results a task reads from its direct upstreams, as the JSON text its task process decodes.

A task's `context["results"]` holds each direct upstream's result; a mapped upstream's is the
list of its instances' results in map_index order. Every instance of a task mapped over a large
result is handed that whole result: a 10,000-item list is 59 KB, which read, decoded and encoded
again for each of 10,000 instances cost a quarter of their run. So the results travel as JSON text
from the database to the task process (decoded once, there), and a worker keeps the large ones
it has read (`_kept`): on PostgreSQL the next claim that needs one reads only whether its row
changed since (`xmin`, the transaction that wrote the row's current version: any UPDATE of the
row changes it, so a kept text is used only while it is exactly the row's result). SQLite has no
such version: there every claim reads the results.

A transaction id means one thing only on one server's history: after a failover to a replica
that had not received the last transactions, or a restore, the same ids are given again to
other writes, so a row can change and keep the `xmin` a kept text was read with. What is kept is
therefore kept for one server (`_server_of`: its system identifier, the timeline it writes on,
and when it started), read once per connection: a connection to another one, or to the same one
promoted or restarted since, finds nothing kept and starts again.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from django.db import DatabaseError, connection, transaction

from orchestrator.data import sql
from orchestrator.models import Task
from retries.states import TaskState

# A result shorter than this is read every time (a null, a few keys): keeping it saves nothing.
KEEP_FROM_CHARS = 1024
# What one worker process keeps, in characters of JSON text: the least recently used goes first.
KEEP_AT_MOST_CHARS = 32 * 1024 * 1024

NULL = "null"

# Kept results by task instance id: (its row's version, its result's text).
Kept = dict[int, tuple[str, str]]


class _KeptResults:
    """Result texts read before, grouped by what a read asks for (a run and an upstream task id:
    one row, or a mapped task's instances). Claims of one worker may run on several threads."""

    def __init__(self, budget: int = KEEP_AT_MOST_CHARS) -> None:
        self._groups: OrderedDict[tuple[int, str], Kept] = OrderedDict()
        self._chars = 0
        self._budget = budget
        self._lock = threading.Lock()
        self._server: str | None = None  # the server what is kept was read from

    def of(self, server: str | None, dag_run_id: int, task_ids: list[str]) -> Kept:
        """A copy of what is kept of these upstreams (a read compares each row with it), for a
        read from `server`: nothing when it is not the server what is kept was read from (or
        when it is not known)."""
        found: Kept = {}
        if server is None:
            return found
        with self._lock:
            self._meet(server)
            for task_id in task_ids:
                group = self._groups.get((dag_run_id, task_id))
                if group:
                    found.update(group)
                    self._groups.move_to_end((dag_run_id, task_id))
        return found

    def keep(self, server: str | None, dag_run_id: int, task_id: str, pk: int, version: str, text: str) -> None:
        if server is None or not KEEP_FROM_CHARS <= len(text) <= self._budget:
            return
        with self._lock:
            self._meet(server)
            group = self._groups.setdefault((dag_run_id, task_id), {})
            replaced = group.pop(pk, None)
            self._chars += len(text) - (len(replaced[1]) if replaced else 0)
            group[pk] = (version, text)
            self._groups.move_to_end((dag_run_id, task_id))
            while self._chars > self._budget:
                _, dropped = self._groups.popitem(last=False)
                self._chars -= sum(len(kept_text) for _, kept_text in dropped.values())

    def clear(self) -> None:
        with self._lock:
            self._groups.clear()
            self._chars = 0

    def _meet(self, server: str) -> None:
        """A read from `server` (the lock held): what was read from another is dropped."""
        if server != self._server:
            self._groups.clear()
            self._chars = 0
            self._server = server


_kept = _KeptResults()


def results_json(dag_run_id: int, upstream: list[str], known: Mapping[str, Any] | None = None) -> str:
    """Each upstream's result in a run, as the JSON text of an object by task id. `known` holds
    results the caller has in hand (a task that is not mapped, whose end it is recording): not
    read again."""
    texts = _result_texts(dag_run_id, upstream, known)
    return "{" + ",".join(f"{json.dumps(task_id)}:{texts[task_id]}" for task_id in upstream) + "}"


def upstream_results(dag_run_id: int, upstream: list[str], known: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`results_json`, decoded."""
    return json.loads(results_json(dag_run_id, upstream, known))


def _result_texts(dag_run_id: int, upstream: list[str], known: Mapping[str, Any] | None) -> dict[str, str]:
    known = {task_id: result for task_id, result in (known or {}).items() if task_id in upstream}
    texts = {task_id: json.dumps(result) for task_id, result in known.items()}
    unread = [task_id for task_id in upstream if task_id not in known]
    if not unread:
        return texts
    instances: dict[str, list[str]] = {}
    for task_id, map_index, text, expand in _read(dag_run_id, unread):
        if expand or map_index >= 0:
            items = instances.setdefault(task_id, [])
            if map_index >= 0:
                items.append(text)
        else:
            texts[task_id] = text
    for task_id, items in instances.items():
        texts[task_id] = "[" + ",".join(items) + "]"
    for task_id in unread:
        texts.setdefault(task_id, NULL)  # no such task instance (a task added since the run began)
    return texts


def _read(dag_run_id: int, task_ids: list[str]) -> list[tuple[str, int, str, Any]]:
    """(task id, map_index, result as JSON text, its task's expand) of the task instances, in
    map_index order; on PostgreSQL a result kept from an earlier read is not read again."""
    expand_field = Task._meta.get_field("expand")
    # Not the instances an expansion over a shorter list removed, nor those parked meanwhile.
    where = (
        f" WHERE ti.dag_run_id = %s AND ti.task_id IN ({sql.placeholders(len(task_ids))})"
        f" AND (ti.map_index = -1 OR (ti.map_index >= 0 AND ti.state <> '{TaskState.REMOVED}')) ORDER BY ti.map_index"
    )
    joined = " FROM orchestrator_taskinstance ti LEFT JOIN orchestrator_task t ON t.id = ti.definition_id"
    if connection.vendor != "postgresql":
        rows = sql.fetch(f"SELECT ti.task_id, ti.map_index, ti.result, t.expand{joined}{where}",
                         [dag_run_id, *task_ids], [None, None, None, expand_field])
        return [(task_id, map_index, _text(result), expand) for task_id, map_index, result, expand in rows]
    server = _server_of(connection)
    kept = _kept.of(server, dag_run_id, task_ids)
    # A kept result's text is not sent again unless its row changed since it was kept.
    rows = sql.fetch(
        "SELECT ti.id, ti.xmin::text, ti.task_id, ti.map_index,"
        " CASE WHEN ti.id::text || ':' || ti.xmin::text = ANY(%s::text[]) THEN NULL ELSE ti.result::text END,"
        f" t.expand{joined}{where}",
        [[f"{pk}:{version}" for pk, (version, _) in kept.items()], dag_run_id, *task_ids],
        [None, None, None, None, None, expand_field],
    )
    read = []
    for pk, version, task_id, map_index, text, expand in rows:
        if text is None:
            same = kept.get(pk)
            text = same[1] if same is not None and same[0] == version else NULL
        else:
            _kept.keep(server, dag_run_id, task_id, pk, version, text)
        read.append((task_id, map_index, text, expand))
    return read


# The server a connection is to, as one text: its system identifier (its own, or that of the
# primary it was copied from), the timeline it writes on (a promotion or a point-in-time restore
# starts a new one at once; pg_control_checkpoint's follows only at the next checkpoint), and
# when it started (a copy started as it was: crash recovery keeps the timeline).
SERVER_SQL = (
    "SELECT s.system_identifier::text || '/' || CASE WHEN pg_is_in_recovery() THEN 'recovery'"
    " ELSE left(pg_walfile_name(pg_current_wal_lsn()), 8) END || '/' || pg_postmaster_start_time()::text"
    " FROM pg_control_system() s"
)


def _server_of(db: Any) -> str | None:
    """The server `db`'s current connection is to (`SERVER_SQL`), read once per connection;
    None when it cannot be read (a role denied those functions): then nothing is kept."""
    db.ensure_connection()
    raw = db.connection
    known = getattr(db, "_orchestrator_server", None)
    if known is not None and known[0] is raw:
        return known[1]
    try:
        with transaction.atomic():  # a savepoint inside the caller's transaction: a refusal ends only it
            ((server,),) = sql.fetch(SERVER_SQL, [], [None])
    except DatabaseError:
        server = None
    db._orchestrator_server = (raw, server)
    return server


def _text(stored: str | None) -> str:
    """A result column's value as JSON text (SQLite keeps the text the ORM wrote; SQL NULL is a
    null result)."""
    return NULL if stored is None else stored
