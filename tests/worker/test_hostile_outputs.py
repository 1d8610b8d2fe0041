"""What a task writes that no database stores as is (NUL, lone surrogates, invalid UTF-8, a
result the database refuses): every attempt still ends, with a record an operator can read.

They run on both databases (`TEST_DATABASE=sqlite bin/test tests/worker/test_hostile_outputs.py`):
SQLite would take a NUL, but the worker replaces it all the same, so both read back the same
text, checked in the rows themselves as well as through the models."""
from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection

from tests.worker.conftest import settle, trigger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

T = "tests.worker.tasks."
REPLACED = "\ufffd"


def test_it_records_an_exception_message_holding_nul(worker, make_dag):
    """ValueError("bad 'a\\x00b'"): failed as task_exception, NUL replaced, and the metadata says so."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "raise_with_nul"}])
    worker()
    run = trigger(dag)
    ti = settle(run, "t", ("failed",), timeout=40)
    attempt = ti.attempts.get()
    assert (attempt.state, attempt.context["reason"]) == ("failed", "task_exception")
    assert attempt.context["metadata"]["message"] == f"bad 'a{REPLACED}b'"
    assert "context.metadata" in attempt.context["metadata"]["sanitised"]
    assert ti.last_failure_context["metadata"]["message"] == f"bad 'a{REPLACED}b'"


def test_it_records_an_exception_message_holding_a_lone_surrogate(worker, make_dag):
    dag = make_dag([{"task_id": "t", "python_callable": T + "raise_with_lone_surrogate"}])
    worker()
    run = trigger(dag)
    ti = settle(run, "t", ("failed",), timeout=40)
    attempt = ti.attempts.get()
    assert attempt.context["metadata"].get("message") == f"half a pair: {REPLACED}", (attempt.context, attempt.stderr)
    assert attempt.context["metadata"]["sanitised"]


def test_it_records_a_result_holding_nul(worker, make_dag):
    """The result is stored with NUL replaced; a success's context stays null, so its stderr says so."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "return_with_nul"}])
    worker()
    run = trigger(dag)
    ti = settle(run, "t", ("success",), timeout=40)
    attempt = ti.attempts.get()
    assert attempt.result == f"before{REPLACED}after"
    assert attempt.context is None
    assert "replaced with U+FFFD in: result" in attempt.stderr


def test_it_records_output_that_is_not_utf8(worker, make_dag):
    dag = make_dag([{"task_id": "t", "python_callable": T + "print_invalid_utf8"}])
    worker()
    run = trigger(dag)
    ti = settle(run, "t", ("success",), timeout=40)
    attempt = ti.attempts.get()
    assert attempt.result == "printed"
    assert "valid, then" in attempt.stdout
    assert "end" in attempt.stdout
    assert "\x00" not in attempt.stdout
    assert REPLACED in attempt.stdout


def test_it_records_a_bash_task_echoing_nul_bytes(worker, make_dag):
    dag = make_dag([{"task_id": "t", "bash_command": r"printf 'a\000b\n'; printf 'err\000or\n' >&2; exit 3"}])
    worker()
    run = trigger(dag)
    ti = settle(run, "t", ("failed",), timeout=40)
    attempt = ti.attempts.get()
    assert attempt.context["reason"] == "nonzero_exit"
    assert attempt.stdout == f"a{REPLACED}b\n"
    assert f"err{REPLACED}or" in attempt.stderr


def test_a_result_that_is_not_json_fails_as_invalid_result(worker, make_dag):
    """NaN is not JSON: the attempt fails as application/invalid_result, charged to the user,
    nothing stored, the lease let go and the worker carrying on."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "return_unstorable_float"}])
    proc = worker()
    run = trigger(dag)
    ti = settle(run, "t", ("failed",), timeout=40)
    attempt = ti.attempts.get()
    assert (attempt.state, attempt.kind) == ("failed", "user")
    assert (attempt.context["category"], attempt.context["reason"]) == ("application", "invalid_result")
    assert attempt.context["metadata"]["problem"] == "not_json"
    assert ti.result is None
    assert proc.poll() is None


def stored(attempt_id: int, column: str) -> Any:
    """What the database itself holds in an attempt's column, read without the models (a JSON
    column parsed: PostgreSQL and SQLite write its text differently, e.g. escapes)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM orchestrator_taskattempt WHERE id = %s", [attempt_id])
        (value,) = cursor.fetchone()
    return json.loads(value) if column in ("result", "context") and isinstance(value, str) else value


def test_hostile_text_everywhere_reads_back_exactly_as_replaced(worker, make_dag):
    """NUL on stdout, invalid UTF-8 on stderr, NUL in a result's key and value, a lone surrogate
    deep in it: each replaced by U+FFFD and nothing else changed, in the row as in the model."""
    dag = make_dag([{"task_id": "t", "python_callable": T + "hostile_everywhere"}])
    worker()
    run = trigger(dag)
    ti = settle(run, "t", ("success",), timeout=40)
    attempt = ti.attempts.get()
    result = {f"k{REPLACED}ey": f"va{REPLACED}lue", "deep": [{"pair": f"half {REPLACED}"}], "fine": "caf\u00e9"}
    stderr = f"err{REPLACED}(or {REPLACED}\n[orchestrator: unstorable characters (NUL, invalid UTF-8) replaced with U+FFFD in: result]\n"
    assert (attempt.result, ti.result) == (result, result)
    assert stored(attempt.pk, "result") == result
    assert attempt.stdout == stored(attempt.pk, "stdout") == f"out{REPLACED}put {REPLACED}\n"
    assert attempt.stderr == stored(attempt.pk, "stderr") == stderr


def test_a_bash_result_holding_nul_reads_back_exactly_as_replaced(worker, make_dag):
    """A bash task's result is its last stdout line: NUL in it replaced, on both databases."""
    dag = make_dag([{"task_id": "t", "bash_command": r"printf 'first\000\nlast\000line\n'"}])
    worker()
    run = trigger(dag)
    ti = settle(run, "t", ("success",), timeout=40)
    attempt = ti.attempts.get()
    assert attempt.result == stored(attempt.pk, "result") == f"last{REPLACED}line"
    assert attempt.stdout == stored(attempt.pk, "stdout") == f"first{REPLACED}\nlast{REPLACED}line\n"


def test_a_failures_hostile_message_reads_back_exactly_as_replaced(worker, make_dag):
    dag = make_dag([{"task_id": "t", "python_callable": T + "raise_with_nul"}], retries=0)
    worker()
    run = trigger(dag)
    ti = settle(run, "t", ("failed",), timeout=40)
    attempt = ti.attempts.get()
    assert stored(attempt.pk, "context")["metadata"]["message"] == attempt.context["metadata"]["message"] == f"bad 'a{REPLACED}b'"
    assert "\\u0000" not in json.dumps(stored(attempt.pk, "context"))  # no NUL anywhere in it
