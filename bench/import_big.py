"""Importing a 10,000-task DAG (layers of fan-out and fan-in) on SQLite, as `make run` does.

    .venv/bin/python -m bench.import_big [--tasks 10000] [--width 1000]

Prints the wall time of the first import, of an unchanged re-import and of a re-import with every
task changed, each split into reading and validating the file, working out the writes (both
without any lock) and the write transaction; and beside them the number of write transactions
and the longest (from its `BEGIN IMMEDIATE`, when SQLite's write lock is taken, to its commit).

Before the imports, the floor of the same run: one plain `INSERT` of as many rows of the same
width through the sqlite3 module (executemany) in the same file, the least the database itself
needs to write that many tasks. Uses a throwaway SQLite file. The load average is printed with
the figures: on a shared machine they are only as good as it was quiet.
"""
from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.big_dag import big_dag


class WriteLockClock:
    """Times every transaction of Django's connection from its `BEGIN` to its commit or rollback:
    on SQLite, whose transactions here are IMMEDIATE (the write lock taken at `BEGIN`), how long
    each held the database's one write lock, whichever code opened it."""

    def __init__(self, connection: Any) -> None:
        self.holds: list[float] = []
        self._began: float | None = None
        self._connection = connection
        for name in ("commit", "rollback"):
            setattr(connection, name, self._ending(getattr(connection, name)))
        self._wrapper = connection.execute_wrapper(self._execute)
        self._wrapper.__enter__()

    def _execute(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.lstrip().upper().startswith("BEGIN"):
            self._began = time.perf_counter()
        return execute(sql, params, many, context)

    def _ending(self, end: Any) -> Any:
        def ended() -> None:
            end()
            if self._began is not None:
                self.holds.append(time.perf_counter() - self._began)
                self._began = None

        return ended

    def take(self) -> list[float]:
        """The holds since the last take."""
        holds, self.holds = self.holds, []
        return holds


def floor_insert(path: str, tasks: int) -> float:
    """Seconds for the database alone to take `tasks` task rows in one transaction."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("CREATE TABLE floor_task (id INTEGER PRIMARY KEY, dag_id INT, task_id TEXT, python_callable TEXT,"
                       " bash_command TEXT, op_kwargs TEXT, upstream TEXT, trigger_rule TEXT, expand TEXT, args TEXT, position INT,"
                       " UNIQUE (dag_id, task_id))")
    rows = [(1, f"t_{i}", "bench.tasks.noop", "", "{}", '["hub_0"]', "all_success", None, "{}", i) for i in range(tasks)]
    began = time.perf_counter()
    connection.execute("BEGIN IMMEDIATE")
    connection.executemany("INSERT INTO floor_task (dag_id, task_id, python_callable, bash_command, op_kwargs, upstream,"
                           " trigger_rule, expand, args, position) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    connection.execute("COMMIT")
    seconds = time.perf_counter() - began
    connection.execute("DROP TABLE floor_task")
    connection.close()
    return seconds


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} {five:.1f} {fifteen:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--width", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-import-") as tmp:
        database = f"{tmp}/db.sqlite3"
        os.environ["DATABASE_URL"] = f"sqlite:///{database}"
        os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")  # settings need one; nothing is written
        os.environ["LOG_LEVEL"] = "WARNING"
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection, transaction

        from orchestrator.specs.importer import load_specs, plan_dag, write_dag

        call_command("migrate", verbosity=0)
        spec_file = Path(tmp) / "big.yaml"
        dag = big_dag("big", args.tasks, args.width)
        spec_file.write_text(yaml.safe_dump(dag, sort_keys=False))
        changed_file = Path(tmp) / "big-changed.yaml"
        for task in dag["tasks"]:
            task["op_kwargs"] = {"changed": True}
        changed_file.write_text(yaml.safe_dump(dag, sort_keys=False))
        print(load())
        print(f"floor: one INSERT of {args.tasks} task rows through sqlite3 itself: {floor_insert(database, args.tasks) * 1000:.0f} ms")
        clock = WriteLockClock(connection)
        for label, path in (("first import", spec_file), ("unchanged re-import", spec_file), ("every task changed", changed_file)):
            started = time.perf_counter()
            specs = load_specs([path])
            validated = time.perf_counter()
            plans = [plan_dag(spec) for spec in specs]
            planned = time.perf_counter()
            with transaction.atomic():
                outcomes = [write_dag(plan.spec, plan) for plan in plans]
            written = time.perf_counter()
            holds = clock.take()
            print(
                f"{label}: {written - started:.2f} s ({validated - started:.2f} s reading and validating,"
                f" {planned - validated:.2f} s working out the writes, {written - planned:.2f} s in the write transaction);"
                f" {len(holds)} write transaction(s), the longest held the write lock {max(holds, default=0) * 1000:.0f} ms -> {outcomes}"
            )
        print(load())


if __name__ == "__main__":
    main()
