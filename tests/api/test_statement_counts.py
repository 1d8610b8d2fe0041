"""A trigger and a run document, the API's busiest answers, in a few statements whatever the
size of the run: none per task, none per attempt (their time is measured by `python -m bench
--only api-profile`, never here)."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from orchestrator.api.tokens import create_token
from orchestrator.models import TaskAttempt
from tests.api.factories import chain_dag

pytestmark = pytest.mark.django_db(transaction=True)

# The token with its user and the user's permissions (one read), the DAG; in one transaction
# the run inserted with its DAG's tasks read (and whether the DAG has deadlines: none here), its
# task instances inserted and read back, the audit entry (3), the run started and its first task
# dispatched (3: the DAG's lock, its running runs counted and the run started if a slot is free,
# the dispatch with its attempt row). The document is built from what the trigger wrote: nothing
# read.
TRIGGER_STATEMENTS = 8
# On SQLite, no lock (its transactions take the database's), but the count and the start, the
# run, the read back of its task instances and the attempt rows are statements of their own, and
# the document reads the task instances and their attempts.
SQLITE_EXTRA_STATEMENTS = 5
TRIGGER_TRANSACTIONS = 1
# The token, the run with its DAG, its task instances (with whether it has task state or deadlines), their attempts.
DOCUMENT_STATEMENTS = 4
TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")


@pytest.fixture
def api(alice) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {create_token(alice)}")


def _task_ids(count: int) -> tuple[str, ...]:
    return tuple(f"t{n}" for n in range(count))


def _statements(call) -> tuple[object, list[str]]:
    """The answer of `call`, and the statements it ran, transaction control left out."""
    answer, statements = _everything(call)
    return answer, [sql for sql in statements if not sql.startswith(TRANSACTION_CONTROL)]


def _everything(call) -> tuple[object, list[str]]:
    with CaptureQueriesContext(connection) as captured:
        answer = call()
    return answer, [query["sql"] for query in captured.captured_queries]


@pytest.mark.parametrize("tasks", [3, 40])
def test_a_trigger_takes_the_same_few_statements_however_many_tasks(api, caches_held, empty_default_queue, tasks):
    chain_dag("etl", _task_ids(tasks))
    assert api.post("/api/v1/dags/etl/runs").status_code == 201  # warms what is read once a while
    answer, statements = _statements(lambda: api.post("/api/v1/dags/etl/runs"))
    assert answer.status_code == 201
    assert len(answer.json()["task_instances"]) == tasks
    assert len(statements) <= TRIGGER_STATEMENTS + (SQLITE_EXTRA_STATEMENTS if connection.vendor == "sqlite" else 0), "\n".join(statements)


def test_a_trigger_commits_once_the_run_with_its_audit_entry_and_its_start(api, caches_held, empty_default_queue):
    chain_dag("etl")
    api.post("/api/v1/dags/etl/runs")
    answer, statements = _everything(lambda: api.post("/api/v1/dags/etl/runs"))
    assert statements.count("COMMIT") == TRIGGER_TRANSACTIONS
    before_commit = statements[: statements.index("COMMIT")]
    assert [sql for sql in before_commit if "orchestrator_auditlog" in sql]
    assert [sql for sql in before_commit if "UPDATE orchestrator_dagrun SET state = 'running'" in sql]
    assert [sql for sql in before_commit if "INSERT INTO orchestrator_taskattempt" in sql or "INSERT INTO \"orchestrator_taskattempt\"" in sql]
    assert answer.json()["state"] == "running"
    assert [ti["state"] for ti in answer.json()["task_instances"]] == ["queued", "none", "none"]


def test_a_trigger_looks_for_no_free_run_id_when_it_is_queued_now(api, caches_held, empty_default_queue):
    chain_dag("etl")
    api.post("/api/v1/dags/etl/runs")
    _, statements = _statements(lambda: api.post("/api/v1/dags/etl/runs"))
    assert not [sql for sql in statements if "LIKE" in sql]


def test_a_run_document_takes_the_same_few_statements_however_many_attempts(api, caches_held, empty_default_queue):
    chain_dag("etl", _task_ids(10))
    run_id = api.post("/api/v1/dags/etl/runs").json()["run_id"]
    first = TaskAttempt.objects.filter(task_instance__task_id="t0").get()
    for token in range(2, 12):  # attempts enough that one read each would show
        first.pk, first.attempt_token = None, token
        first.save()
    answer, statements = _statements(lambda: api.get(f"/api/v1/dags/etl/runs/{run_id}"))
    assert answer.status_code == 200
    assert len(answer.json()["task_instances"][0]["attempts"]) == 11
    assert len(statements) <= DOCUMENT_STATEMENTS, "\n".join(statements)
