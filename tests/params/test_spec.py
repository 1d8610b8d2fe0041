"""`params` and `strict_params` in DAG spec files: import errors, export -> import, the examples."""
from __future__ import annotations

from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import CommandError, call_command

from orchestrator.models import Dag
from orchestrator.specs.schema import validate_dag
from tests.params.conftest import PARAMS
from tests.specs.conftest import snapshot

pytestmark = pytest.mark.django_db


def run(command: str, *args: str) -> str:
    out = StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def write(tmp_path: Path):
    def write(content: Any, name: str = "dag.yaml") -> Path:
        path = tmp_path / name
        path.write_text(content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False))
        return path

    return write


def problems_of(spec: dict[str, Any]) -> list[str]:
    return [str(problem) for problem in validate_dag(spec)[1]]


def import_error(write, spec: dict[str, Any]) -> str:
    with pytest.raises(CommandError) as caught:
        run("import_dags", str(write(spec)))
    assert not Dag.objects.exists()
    return str(caught.value)


def test_it_imports_params_and_strict_params(write, spec):
    run("import_dags", str(write({**spec, "strict_params": True})))
    dag = Dag.objects.get(dag_id="report")
    assert dag.params == PARAMS
    assert dag.strict_params is True


def test_a_bad_schema_is_an_import_error_naming_file_dag_and_field(write, spec):
    spec["params"]["day_offset"] = {"type": "integr", "default": 1}
    message = import_error(write, spec)
    assert "dag.yaml: dag 'report': params.day_offset.type: is not a valid JSON Schema (draft 2020-12)" in message


def test_a_default_that_does_not_match_its_schema_is_an_import_error(write, spec):
    spec["params"]["day_offset"]["default"] = 45
    message = import_error(write, spec)
    assert "dag 'report': params.day_offset.default: does not match the param's own schema: must be at most 30; got 45" in message


def test_a_required_param_on_a_scheduled_dag_is_an_import_error(write, spec):
    message = import_error(write, {**spec, "schedule": "@daily"})
    assert "dag 'report': params.mode: has no default, so the DAG cannot have a schedule" in message
    assert problems_of({**spec, "schedule": "@daily", "params": {"mode": {**PARAMS["mode"], "default": "full"}}}) == []


@pytest.mark.parametrize(
    ("params", "strict", "expected"),
    [
        ([1], False, "params: must be a mapping of param names to JSON Schemas, not [1]"),
        ({"a b": {}}, False, "params: param name 'a b' must be 1-100 letters"),
        ({"x.y": {}}, False, "params: param name 'x.y' must be"),
        ({"a": "string"}, False, "params.a: must be a JSON Schema mapping"),
        ({"a": {"type": "string", "description": 5}}, False, "params.a.description: must be a string, not 5"),
        ({"a": {"$ref": "https://example.com/s.json"}}, False, "params.a: refers outside its own schema"),
        ({"a": {"items": {"$dynamicRef": "other.json#x"}}}, False, "params.a: refers outside its own schema"),
        ({"a": {"minimum": "zero"}}, False, "params.a.minimum: is not a valid JSON Schema"),
        ({"a": {"type": "string"}}, "yes", "strict_params: must be true or false, not 'yes'"),
    ],
)
def test_it_refuses_what_is_not_a_param_declaration(spec, params, strict, expected):
    problems = problems_of({**spec, "params": params, "strict_params": strict})
    assert any(problem.startswith(expected) for problem in problems), problems


def test_a_deeply_nested_or_huge_declaration_is_a_problem_not_a_crash(spec):
    deep: dict[str, Any] = {}
    for _ in range(5_000):
        deep = {"items": deep}
    assert any("nested deeper than 64 levels" in p for p in problems_of({**spec, "params": {"a": deep}}))
    huge = {"type": "string", "enum": ["x" * 1000] * 10_000}
    [problem] = problems_of({**spec, "params": {"a": {**huge, "default": "y"}}})
    assert problem.startswith("params.a.default: does not match the param's own schema: must be one of")
    assert len(problem) < 400


def test_a_nul_in_a_declaration_is_an_import_error(spec):
    assert any(p.startswith("params.team.default: must not contain the NUL") for p in problems_of({**spec, "params": {"team": {"default": "a\x00"}}}))


def test_a_local_reference_is_fine(spec):
    params = {"day": {"$defs": {"d": {"type": "string", "format": "date"}}, "$ref": "#/$defs/d", "default": "2026-01-01"}}
    assert problems_of({**spec, "params": params}) == []
    params["day"]["default"] = "yesterday"
    assert any(p.startswith("params.day.default: does not match") for p in problems_of({**spec, "params": params}))


def test_export_then_import_is_a_no_op(write, spec):
    run("import_dags", str(write({**spec, "strict_params": True})))
    before = snapshot()
    exported = run("export_dags")
    [dag] = yaml.safe_load(exported)
    assert dag["params"] == PARAMS
    assert dag["strict_params"] is True
    assert "0 created, 0 updated" in run("import_dags", str(write(exported, "exported.yaml")))
    assert snapshot() == before
    assert run("export_dags") == exported


def test_removing_params_from_the_file_removes_them(write, spec):
    run("import_dags", str(write({**spec, "strict_params": True})))
    del spec["params"]
    run("import_dags", str(write(spec)))
    dag = Dag.objects.get()
    assert dag.params == {}
    assert dag.strict_params is False
    assert "params" not in yaml.safe_load(run("export_dags"))[0]


def test_the_mapping_example_declares_its_team():
    """A plain trigger of example_mapping reports for a team, not for a blank one."""
    spec, problems = validate_dag(yaml.safe_load(Path("dags/example_mapping.yaml").read_text()))
    assert problems == []
    assert spec["params"]["team"]["default"] == "data"
    assert spec["params"]["team"]["type"] == "string"
