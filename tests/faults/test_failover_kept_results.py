"""A worker keeps large upstream results it has read, and reads again only a row whose version
(`xmin`) changed. After a failover to a replica that had not received the last transactions,
the promoted server gives the same transaction ids again: a row can change and keep the version
a kept result was read with. Kept results are for one server only: a real primary, a real copy
of it promoted (a cluster of the test's own, never the machine's), the same transaction id for
two different writes of one row, and the worker's read after the failover hands on the new one."""
from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connection

from orchestrator.engine import upstream
from orchestrator.engine.upstream import results_json
from tests.faults.private_postgres import PrivatePostgres, _free_port, query

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

RUN, TASK_INSTANCE = 3, 7
BEFORE = [f"primary-{i:05d}" for i in range(200)]  # large enough to be kept
AFTER = [f"promoted-{i:05d}" for i in range(200)]

# Only what the read of upstream results touches.
TABLES = """
CREATE TABLE orchestrator_task (id bigint PRIMARY KEY, expand jsonb);
CREATE TABLE orchestrator_taskinstance (
    id bigint PRIMARY KEY, dag_run_id bigint, task_id text, map_index int, state text, result jsonb, definition_id bigint
);
INSERT INTO orchestrator_taskinstance VALUES (7, 3, 'extract', -1, 'success', '"first"', NULL);
CHECKPOINT;
"""


def url(cluster: PrivatePostgres) -> str:
    return f"postgres://postgres@127.0.0.1:{cluster.port}/postgres"


def copy_of(cluster: PrivatePostgres) -> PrivatePostgres:
    """A stopped cluster's data directory copied, as a replica that has what the primary had
    then and nothing after; it starts as a standby (promoted later)."""
    copy = PrivatePostgres.__new__(PrivatePostgres)
    copy.bin, copy.port = cluster.bin, _free_port()
    copy.dir = Path(tempfile.mkdtemp(prefix="private-pg-"))
    copy.data = copy.dir / "data"
    subprocess.run(["cp", "-a", str(cluster.data), str(copy.data)], check=True)
    subprocess.run(["chown", "-R", "postgres:postgres", str(copy.dir)], check=True)
    (copy.data / "standby.signal").touch()
    subprocess.run(["chown", "postgres:postgres", str(copy.data / "standby.signal")], check=True)
    return copy


@contextmanager
def connected_to(cluster: PrivatePostgres) -> Iterator[None]:
    """This thread's Django connection to the cluster's `postgres` database (as a worker's
    connection would be to whichever server the database's address leads to)."""
    saved = {key: connection.settings_dict[key] for key in ("HOST", "PORT", "NAME")}
    connection.close()
    connection.settings_dict.update({"HOST": "127.0.0.1", "PORT": str(cluster.port), "NAME": "postgres"})
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.update(saved)


@pytest.fixture
def clusters() -> Iterator[list[PrivatePostgres]]:
    if connection.vendor != "postgresql":
        pytest.skip("SQLite rows have no version: nothing is kept")
    made: list[PrivatePostgres] = []
    upstream._kept.clear()
    yield made
    upstream._kept.clear()
    for cluster in made:
        cluster.close()


def test_a_result_kept_from_the_old_primary_is_not_handed_on_after_a_failover(clusters):
    primary = PrivatePostgres()
    clusters.append(primary)
    primary.start()
    for statement in TABLES.strip().split(";\n"):
        query(url(primary), statement)
    primary.stop()
    replica = copy_of(primary)  # it will never see what the primary writes from now on
    clusters.append(replica)
    primary.start()

    # The primary's last write, which the replica never receives; a worker reads it and keeps it.
    [(version,)] = query(url(primary), "UPDATE orchestrator_taskinstance SET result = %s WHERE id = %s RETURNING xmin::text::bigint",
                         (json.dumps(BEFORE), TASK_INSTANCE))  # fmt: skip
    with connected_to(primary):
        assert json.loads(results_json(RUN, ["extract"])) == {"extract": BEFORE}
        first = upstream._server_of(connection)
    with connected_to(primary):  # a new connection to the same server: what was kept still serves
        assert upstream._server_of(connection) == first
        assert upstream._kept.of(first, RUN, ["extract"]) == {TASK_INSTANCE: (str(version), json.dumps(BEFORE))}

    # The failover: the primary is gone, the replica promoted; its next transaction ids are those
    # the primary had already given.
    primary.stop()
    replica.start()
    replica._as_postgres("pg_ctl", "-D", str(replica.data), "-w", "-t", "120", "promote")
    while True:
        [(next_id,)] = query(url(replica), "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")  # not taken yet
        assert next_id <= version, f"the promoted server is past the primary's id {version} already: {next_id}"
        if next_id == version:
            break
        query(url(replica), "SELECT txid_current()")  # takes one
    [(reused,)] = query(url(replica), "UPDATE orchestrator_taskinstance SET result = %s WHERE id = %s RETURNING xmin::text::bigint",
                        (json.dumps(AFTER), TASK_INSTANCE))  # fmt: skip
    assert reused == version  # the same row, the same version, a different result

    with connected_to(replica):
        assert upstream._server_of(connection) != first
        assert json.loads(results_json(RUN, ["extract"])) == {"extract": AFTER}
