"""Fresh planner statistics for a table that a big run has just grown (PostgreSQL).

An attempt's moves are prepared statements (`sql.cursor`): PostgreSQL plans one once for any
parameters and keeps that plan until the table's statistics change. Planned while the tables
were tiny, as on a new installation, the plan reads the whole table to find one row, and keeps
doing so as a run of thousands of tasks is created, until autovacuum's ANALYZE comes (a minute
or more later): measured, a move in a 20,000-task table took 2.9 ms instead of 0.1, in every
worker, for every claim, handshake and report. A write that adds more rows than the
statistics know of analyzes the table once it is committed, and the new statistics make every
session plan its prepared statements again.
"""
from __future__ import annotations

import functools
import logging

from django.db import DatabaseError, connection, transaction

log = logging.getLogger(__name__)

# Fewer rows than this never make a plan go wrong by much: not worth an ANALYZE.
ANALYZE_FROM_ROWS = 1000
# How long the ANALYZE may wait for its lock (autovacuum's own, an operator's VACUUM) and run:
# it is a courtesy, and the caller (a trigger, a scheduler pass, a report) must not hang on it.
LOCK_WAIT_MS = 1000
RUN_MS = 30_000


def needs_analyze(added: int, known_rows: float) -> bool:
    """Whether `added` new rows outgrow what the statistics know of the table (`known_rows`,
    PostgreSQL's `reltuples`: -1 before the table was ever analyzed)."""
    return added >= ANALYZE_FROM_ROWS and known_rows < added


def analyzed_after_commit(added: int) -> bool:
    """Whether `added` rows written to a table may have it analyzed once they are committed
    (`grew`): what plans the next statements on it must wait for that commit."""
    return connection.vendor == "postgresql" and added >= ANALYZE_FROM_ROWS


def grew(table: str, added: int) -> None:
    """`added` rows were written to `table` (in the current transaction, if any): once they are
    committed, analyze the table if its statistics do not know of as many rows."""
    if not analyzed_after_commit(added):
        return
    transaction.on_commit(functools.partial(_analyze_if_outgrown, table, added), robust=True)


def _analyze_if_outgrown(table: str, added: int) -> None:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [table])
            (known,) = cursor.fetchone()
            if not needs_analyze(added, known):
                return
            cursor.execute(f"SET LOCAL lock_timeout = {LOCK_WAIT_MS}")
            cursor.execute(f"SET LOCAL statement_timeout = {RUN_MS}")
            cursor.execute(f"ANALYZE {connection.ops.quote_name(table)}")
    except DatabaseError as exc:
        log.warning("could not analyze %s after %d rows were added (autovacuum will): %s", table, added, exc)
        return
    log.info("analyzed %s after %d rows were added (its statistics knew of %d)", table, added, max(0, int(known)))
