"""The spec importer under random and malformed input: always a clear error naming the file, or
a correct import; never a crash, never a half-written DAG."""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import CommandError, call_command
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from orchestrator.models import Dag, Task
from orchestrator.specs.errors import SpecError
from orchestrator.specs.importer import import_paths
from tests.specs.conftest import BASELINE, snapshot

pytestmark = pytest.mark.django_db

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
)
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=20)
nasty_text = st.one_of(
    st.text(max_size=60),
    st.sampled_from(["<script>alert(1)</script>", "é\u200bü", "a" * 300, "..", "-", "../../etc/passwd", "\u0000", "a\u0000b", "%s%n", "{{ dag_id }}", "🚀", "ＡＢＣ"]),
)


def _import(path: Path) -> tuple[str, Any]:
    """('ok', result) or ('error', message); anything else escapes and fails the test."""
    before = snapshot()
    try:
        return "ok", import_paths([path])
    except SpecError as exc:
        assert snapshot() == before, "a failed import changed the database"
        message = str(exc)
        assert str(path) in message, message
        return "error", message


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


@FUZZ
@given(text=st.one_of(st.text(max_size=400), st.binary(max_size=400).map(lambda b: b.decode("latin-1"))), suffix=st.sampled_from(["yaml", "yml", "json"]))
def test_random_text_is_a_clear_error_or_an_import(tmp_path_factory, text, suffix):
    tmp_path = tmp_path_factory.mktemp("spec")
    try:
        path = _write(tmp_path, f"dag.{suffix}", text)
    except UnicodeEncodeError:
        assume(False)
    _import(path)


@FUZZ
@given(data=json_value, as_json=st.booleans())
def test_random_structures_are_a_clear_error_or_an_import(tmp_path_factory, data, as_json):
    tmp_path = tmp_path_factory.mktemp("spec")
    text = json.dumps(data) if as_json else yaml.safe_dump(data)
    _import(_write(tmp_path, "dag.json" if as_json else "dag.yaml", text))


def _paths(spec: Any, prefix=()) -> list[tuple]:
    out = [prefix]
    if isinstance(spec, dict):
        for key, value in spec.items():
            out += _paths(value, prefix + (key,))
    elif isinstance(spec, list):
        for i, value in enumerate(spec):
            out += _paths(value, prefix + (i,))
    return out


def _set(spec: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    target = spec
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return spec


@FUZZ
@given(data=st.data())
def test_a_valid_spec_with_random_fields_broken(tmp_path_factory, data):
    """The full baseline spec with one to three values replaced by junk (unicode, HTML, wrong
    types, huge numbers): a clear error, or an import that stores exactly the tasks written."""
    tmp_path = tmp_path_factory.mktemp("spec")
    spec = copy.deepcopy(BASELINE)
    spec["deadlines"] = [d for d in spec["deadlines"] if not str(d.get("callback", "")).startswith("tests.")]
    paths = _paths(spec)[1:]
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        try:
            _set(spec, path, data.draw(st.one_of(json_value, nasty_text)))
        except (KeyError, IndexError, TypeError):
            pass
        paths = _paths(spec)[1:] or [("dag_id",)]
    as_json = data.draw(st.booleans())
    try:
        text = json.dumps(spec, allow_nan=True) if as_json else yaml.safe_dump(spec, allow_unicode=True)
    except (ValueError, TypeError):
        assume(False)
    outcome, value = _import(_write(tmp_path, "dag.json" if as_json else "dag.yaml", text))
    if outcome == "ok":
        dag = Dag.objects.get(dag_id=spec["dag_id"])
        assert sorted(Task.objects.filter(dag=dag).values_list("task_id", flat=True)) == sorted(t["task_id"] for t in spec["tasks"])


@FUZZ
@given(dag_id=nasty_text, task_id=nasty_text, description=nasty_text)
def test_unicode_and_html_in_ids_and_text(tmp_path_factory, dag_id, task_id, description):
    """Ids outside [A-Za-z0-9_.-]{1,250} are refused with the field named; any description is
    stored exactly as written."""
    tmp_path = tmp_path_factory.mktemp("spec")
    spec = {"dag_id": dag_id, "description": description, "schedule": None, "tasks": [{"task_id": task_id, "bash_command": "true"}]}
    try:
        path = _write(tmp_path, "dag.json", json.dumps(spec))
    except UnicodeEncodeError:
        assume(False)
    outcome, value = _import(path)
    import re

    valid = re.compile(r"[A-Za-z0-9_.\-]{1,250}")
    if outcome == "ok":
        assert valid.fullmatch(dag_id)
        assert valid.fullmatch(task_id)
        assert "\x00" not in description
        assert Dag.objects.get(dag_id=dag_id).description == description
    elif not valid.fullmatch(dag_id):
        assert "dag_id" in value
    elif not valid.fullmatch(task_id):
        assert "task_id" in value


def test_a_directory_with_one_bad_file_imports_nothing(tmp_path):
    good = {"dag_id": "good", "schedule": None, "tasks": [{"task_id": "a", "bash_command": "true"}]}
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(good))
    (tmp_path / "b.json").write_text('{"dag_id": "bad", "tasks": [')
    with pytest.raises(CommandError) as raised:
        call_command("import_dags", str(tmp_path))
    assert "b.json" in str(raised.value)
    assert not Dag.objects.exists()


def test_a_10000_task_fan_out_imports_whole(tmp_path):
    tasks = [{"task_id": "root", "bash_command": "true"}]
    tasks += [{"task_id": f"leaf{i}", "bash_command": "true", "upstream": ["root"]} for i in range(9_999)]
    path = tmp_path / "fan.json"
    path.write_text(json.dumps({"dag_id": "fan", "schedule": None, "tasks": tasks}))
    started = time.monotonic()
    result = import_paths([path])
    assert result.created == ["fan"]
    assert Task.objects.filter(dag__dag_id="fan").count() == 10_000
    # 50-90 s on a shared 2-core machine: far slower than anything else here, but whole.
    assert time.monotonic() - started < 300
    # Importing it again changes nothing.
    assert import_paths([path]).unchanged == ["fan"]


def test_a_1000_deep_chain_and_a_cycle_at_its_end(tmp_path):
    tasks = [{"task_id": "t0", "bash_command": "true"}] + [{"task_id": f"t{i}", "bash_command": "true", "upstream": [f"t{i - 1}"]} for i in range(1, 1000)]
    path = tmp_path / "chain.yaml"
    path.write_text(yaml.safe_dump({"dag_id": "chain", "schedule": None, "tasks": tasks}))
    assert import_paths([path]).created == ["chain"]
    assert Task.objects.filter(dag__dag_id="chain").count() == 1000
    tasks[0]["upstream"] = ["t999"]  # close the loop: a cycle through 1,000 tasks
    path.write_text(yaml.safe_dump({"dag_id": "chain", "schedule": None, "tasks": tasks}))
    before = snapshot()
    with pytest.raises(SpecError) as raised:
        import_paths([path])
    assert "cycle" in str(raised.value).lower()
    assert snapshot() == before


def test_deeply_nested_yaml_is_a_clear_error(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("dag_id: deep\nschedule: null\ntasks: " + "[" * 5000 + "]" * 5000 + "\n")
    outcome, _ = _import(path)
    assert outcome == "error"
    path = tmp_path / "deep.json"
    path.write_text('{"dag_id": "deep", "tasks": ' + "[" * 100000 + "]" * 100000 + "}")
    outcome, _ = _import(path)
    assert outcome == "error"


def test_a_yaml_billion_laughs_is_refused_quickly(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    lines.append("dag_id: laughs\ntasks: *a8")
    path = tmp_path / "laughs.yaml"
    path.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    outcome, _ = _import(path)
    assert outcome == "error"
    assert time.monotonic() - started < 20
