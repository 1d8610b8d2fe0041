"""The task process's pure helpers: templates, calling conventions, results."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from orchestrator.foundation.templating import render
from orchestrator.worker.task.runner import (
    PythonTask,
    accepts_context,
    import_callable,
    outcome_of,
)
from tests.conftest import ROOT

CONTEXT = {
    "dag_id": "etl",
    "task_id": "load",
    "run_id": "manual__2026-01-02T03:04:05+00:00",
    "try_number": 2,
    "infrastructure_try_number": 0,
    "logical_date": "2026-01-02T03:04:05+00:00",
    "conf": {},
}


def test_it_renders_context_values_into_a_bash_command():
    """{{ name }} (spaces optional) becomes a reference to a variable holding the context value;
    unknown names stay as written."""
    command = "run --day {{ logical_date }} --id {{dag_id}}.{{ task_id }}/{{ run_id }} -t {{ try_number }} {{ secret }}"
    rendered = render(command, CONTEXT)
    assert rendered.command == (
        'run --day "${ORCHESTRATOR_SUBST_0}" --id "${ORCHESTRATOR_SUBST_1}"."${ORCHESTRATOR_SUBST_2}"/"${ORCHESTRATOR_SUBST_3}"'
        ' -t "${ORCHESTRATOR_SUBST_4}" {{ secret }}'
    )
    assert list(rendered.env.values()) == ["2026-01-02T03:04:05+00:00", "etl", "load", "manual__2026-01-02T03:04:05+00:00", "2"]


def test_it_passes_context_only_to_callables_that_take_it():
    assert accepts_context(lambda context: None)
    assert accepts_context(lambda **kwargs: None)
    assert not accepts_context(lambda source: None)


def test_it_calls_a_function_with_its_kwargs_and_the_context():
    def extract(source, context):
        return f"{source}@{context['task_id']}"

    assert PythonTask(extract, {"source": "s3"}, CONTEXT).run() == {"type": "success", "result": "s3@load"}


def test_it_instantiates_a_task_class_with_its_kwargs_and_runs_execute():
    class Load:
        def __init__(self, table):
            self.table = table

        def execute(self, context):
            return [self.table, context["try_number"]]

        def on_kill(self, execution_context):
            pass

    task = PythonTask(Load, {"table": "t"}, CONTEXT)
    assert task.run()["result"] == ["t", 2]
    assert task.on_kill() == task.instance.on_kill


def test_it_refuses_a_result_that_is_not_json_or_too_large_saying_why():
    assert outcome_of({"a": [1, 2]}, 65536) == {"type": "success", "result": {"a": [1, 2]}}
    assert outcome_of({1, 2}, 65536)["problem"]["problem"] == "not_json"
    assert outcome_of(float("nan"), 65536)["problem"]["problem"] == "not_json"
    too_large = outcome_of("x" * 70_000, 65536)
    assert too_large["type"] == "invalid_result"
    assert too_large["problem"]["size_bytes"] == 70_002
    assert too_large["problem"]["max_bytes"] == 65536
    # NUL and lone surrogates are JSON: the worker replaces them where it builds the report.
    assert outcome_of({"k": "a\x00b"}, 65536) == {"type": "success", "result": {"k": "a\x00b"}}
    assert outcome_of("\udc80", 65536)["type"] == "success"


def test_it_names_the_path_of_a_callable_it_cannot_import():
    with pytest.raises(ImportError, match="'tests.worker.tasks' has no attribute 'nope'"):
        import_callable("tests.worker.tasks.nope")
    with pytest.raises(ImportError, match="no module named 'nope'"):
        import_callable("nope")


def test_it_refuses_to_start_a_worker_with_a_bad_failpoint_spec():
    """run_worker checks ORCHESTRATOR_FAILPOINTS before it takes any job."""
    result = subprocess.run(
        [sys.executable, "manage.py", "run_worker", "--burst"],
        cwd=ROOT,
        env={**os.environ, "ORCHESTRATOR_FAILPOINTS": "task.before_running=boom"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "ORCHESTRATOR_FAILPOINTS: cannot parse 'task.before_running=boom'" in result.stderr
