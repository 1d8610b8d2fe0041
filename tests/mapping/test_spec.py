"""`expand`, `max_active_tis_per_dagrun` and result templates in DAG specs: validated at import
(errors naming the file, DAG, task and field, nothing changed), exported as written, and edited in
the admin with the same rules."""
from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from orchestrator.models import Dag, Task
from tests.admin.conftest import admin_client, errors_of  # noqa: F401
from tests.admin.test_task_admin import task_post, url
from tests.specs.conftest import snapshot

pytestmark = pytest.mark.django_db

SPEC = {
    "dag_id": "daily_files",
    "tasks": [
        {"task_id": "list_files", "python_callable": "examples.mapping.list_files"},
        {"task_id": "load", "python_callable": "examples.mapping.load_file", "upstream": ["list_files"],
         "expand": {"path": "results.list_files"}, "max_active_tis_per_dagrun": 4},
        {"task_id": "shout", "bash_command": 'echo "{{ results.list_files }} {{ conf.day }} {{ word }}"',
         "upstream": ["list_files"], "expand": {"word": ["a", "b"]}},
        {"task_id": "report", "bash_command": "echo {{ results.load }} {{ results.list_files.0 }}",
         "upstream": ["load", "list_files"]},
    ],
}


def _write(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / "daily_files.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _import(path: Path) -> str:
    out = StringIO()
    call_command("import_dags", str(path), stdout=out)
    return out.getvalue()


def test_it_imports_expand_and_exports_it_so_that_a_reimport_is_a_no_op(tmp_path):
    _import(_write(tmp_path, SPEC))
    load = Task.objects.get(task_id="load")
    assert load.expand == {"path": "results.list_files"}
    assert load.args == {"max_active_tis_per_dagrun": 4}
    out = StringIO()
    call_command("export_dags", "daily_files", stdout=out)
    exported = tmp_path / "exported.yaml"
    exported.write_text(out.getvalue())
    (exported_dag,) = yaml.safe_load(out.getvalue())
    assert exported_dag["tasks"][1]["expand"] == {"path": "results.list_files"}
    assert "unchanged daily_files" in _import(exported)


def _with(task_index: int, **changes) -> dict:
    spec = yaml.safe_load(yaml.safe_dump(SPEC))
    spec["tasks"][task_index].update(changes)
    return spec


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        (_with(1, expand={"path": "results.shout"}), "tasks[1].expand.path", "'shout', which is not a direct upstream"),
        (_with(1, expand={"path": "results.nowhere"}), "tasks[1].expand.path", "not a direct upstream"),
        (_with(1, expand={"run_id": [1]}), "tasks[1].expand", "'run_id' is a context name"),
        (_with(1, expand={"a": [1], "b": [2]}), "tasks[1].expand", "exactly one name, not 2"),
        (_with(1, expand={"path": "a string"}), "tasks[1].expand.path", "must be a list, or results.TASK_ID"),
        (_with(1, expand={"path": list(range(1025))}), "tasks[1].expand.path", "1025 items, over ORCHESTRATOR_MAX_MAP_LENGTH=1024"),
        (_with(1, expand={"path": [1]}, op_kwargs={"path": "x"}), "tasks[1].expand", "also a key of op_kwargs"),
        (_with(1, max_active_tis_per_dagrun=0), "tasks[1].max_active_tis_per_dagrun", "whole number >= 1"),
        (_with(3, bash_command="echo {{ results.shout }}"), "tasks[3].bash_command", "{{ results.shout }} does not name a direct upstream"),
    ],
    ids=["not_upstream", "unknown", "context_name", "two_names", "bad_source", "too_long", "op_kwargs_clash", "bad_cap", "template"],
)
def test_it_refuses_a_bad_expand_or_template_naming_file_dag_task_and_field(tmp_path, spec, field, says):
    path = _write(tmp_path, spec)
    before = snapshot()
    with pytest.raises(CommandError) as info:
        _import(path)
    message = str(info.value)
    assert str(path) in message, message
    assert "daily_files" in message, message
    assert field in message, message
    assert says in message, message
    assert snapshot() == before


def test_the_admin_edits_expand_with_the_same_rules(admin_client, tmp_path):  # noqa: F811
    _import(_write(tmp_path, SPEC))
    task = Task.objects.get(task_id="load")
    bad = admin_client.post(url(task), task_post(task, expand='{"path": "results.report"}', args='{"max_active_tis_per_dagrun": 4}'))
    assert "not a direct upstream" in errors_of(bad)
    assert Task.objects.get(pk=task.pk).expand == {"path": "results.list_files"}
    good = admin_client.post(url(task), task_post(task, expand='{"path": [1, 2]}', args='{"max_active_tis_per_dagrun": 4}'))
    assert good.status_code == 302, errors_of(good)
    assert Task.objects.get(pk=task.pk).expand == {"path": [1, 2]}
    # The DAG page's inline has no expand column: saving the DAG keeps it.
    assert Dag.objects.get(dag_id="daily_files").tasks.get(task_id="load").expand == {"path": [1, 2]}
