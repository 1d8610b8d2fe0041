"""default_args takes every task key but a task's identity and shape, checked as on a task:
limits (pool, pool_slots, priority_weight, max_active_tis_per_dag, circuit) and trigger_rule
too; export -> import changes nothing; the admin holds them to the same rules."""
from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from orchestrator.engine.run_creation import create_manual_run
from orchestrator.models import Circuit, Dag, Pool, TaskInstance
from orchestrator.specs.schema import DEFAULT_ARG_KEYS, TASK_KEYS, TASK_ONLY_KEYS, validate_dag
from tests.admin.conftest import dag_post, errors_of
from tests.specs.conftest import snapshot

pytestmark = pytest.mark.django_db

LIMITS = {"pool": "warehouse", "pool_slots": 2, "priority_weight": 7, "max_active_tis_per_dag": 3, "circuit": "vendor-api"}


def spec(default_args: dict, tasks: list[dict] | None = None) -> dict:
    return {
        "dag_id": "defaults",
        "default_args": default_args,
        "tasks": tasks or [{"task_id": "a", "bash_command": "true"}, {"task_id": "b", "bash_command": "true", "upstream": ["a"]}],
    }


def write(tmp_path: Path, data: object, name: str = "dag.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def run(command: str, *args: str) -> str:
    out = StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


def test_every_task_key_but_identity_and_shape_is_a_default_arg():
    assert set(DEFAULT_ARG_KEYS) == set(TASK_KEYS) - set(TASK_ONLY_KEYS)
    assert {"circuit", "pool", "pool_slots", "priority_weight", "max_active_tis_per_dag", "trigger_rule"} <= set(DEFAULT_ARG_KEYS)
    for key in ("task_id", "python_callable", "bash_command", "op_kwargs", "upstream"):
        _, problems = validate_dag(spec({key: "x"}))
        assert [p.path for p in problems] == [f"default_args.{key}"], key


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("pool_slots", 0, "whole number >= 1"),
        ("priority_weight", "high", "whole number"),
        ("max_active_tis_per_dag", -1, "whole number >= 1"),
        ("circuit", "has space", "name of 1-250"),
        ("pool", 3, "name of 1-250"),
        ("trigger_rule", "sometimes", "must be one of"),
    ],
)
def test_a_bad_default_is_refused_as_on_a_task(tmp_path, key, value, fragment):
    Pool.objects.create(name="warehouse", slots=4)
    before = snapshot()
    with pytest.raises(CommandError) as info:
        run("import_dags", str(write(tmp_path, spec({**LIMITS, key: value}))))
    message = str(info.value)
    assert "dag.yaml" in message
    assert "defaults" in message
    assert f"default_args.{key}" in message
    assert fragment in message
    assert snapshot() == before


def test_an_unknown_pool_in_default_args_is_refused_naming_it(tmp_path):
    with pytest.raises(CommandError) as info:
        run("import_dags", str(write(tmp_path, spec({"pool": "nowhere"}))))
    assert "default_args.pool" in str(info.value)
    assert "unknown pool 'nowhere'" in str(info.value)
    assert not Dag.objects.exists()


def test_limit_defaults_reach_every_task_instance_and_a_task_overrides_them(tmp_path):
    Pool.objects.create(name="warehouse", slots=4)
    Pool.objects.create(name="other", slots=1)
    tasks = [{"task_id": "a", "bash_command": "true"}, {"task_id": "b", "bash_command": "true", "pool": "other", "priority_weight": 1}]
    run("import_dags", str(write(tmp_path, spec(LIMITS, tasks))))
    assert Circuit.objects.filter(name="vendor-api").exists()
    run_ = create_manual_run(Dag.objects.get(dag_id="defaults"))
    a = TaskInstance.objects.get(dag_run=run_, task_id="a")
    b = TaskInstance.objects.get(dag_run=run_, task_id="b")
    assert (a.pool, a.pool_slots, a.priority_weight, a.circuit) == ("warehouse", 2, 7, "vendor-api")
    assert (b.pool, b.pool_slots, b.priority_weight, b.circuit) == ("other", 2, 1, "vendor-api")


def test_a_default_trigger_rule_applies_to_tasks_that_name_none(tmp_path):
    tasks = [
        {"task_id": "a", "bash_command": "true"},
        {"task_id": "b", "bash_command": "true", "upstream": ["a"]},
        {"task_id": "c", "bash_command": "true", "upstream": ["a"], "trigger_rule": "all_success"},
    ]
    run("import_dags", str(write(tmp_path, spec({"trigger_rule": "all_done"}, tasks))))
    rules = dict(Dag.objects.get(dag_id="defaults").tasks.values_list("task_id", "trigger_rule"))
    assert rules == {"a": "all_done", "b": "all_done", "c": "all_success"}


def test_export_then_import_changes_nothing(tmp_path):
    Pool.objects.create(name="warehouse", slots=4)
    tasks = [
        {"task_id": "a", "bash_command": "true"},
        {"task_id": "b", "bash_command": "true", "upstream": ["a"], "trigger_rule": "all_success", "pool_slots": 1},
    ]
    run("import_dags", str(write(tmp_path, spec({**LIMITS, "retries": 2, "trigger_rule": "one_failed"}, tasks))))
    before = snapshot()
    exported = run("export_dags", "defaults")
    assert yaml.safe_load(exported)[0]["default_args"] == {"retries": 2, **LIMITS, "trigger_rule": "one_failed"}
    assert "0 created, 0 updated" in run("import_dags", str(write(tmp_path, exported, "exported.yaml")))
    assert snapshot() == before
    assert run("export_dags", "defaults") == exported


def test_the_admin_accepts_limit_defaults_and_refuses_bad_ones(client):
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("admin", "admin@example.com", password=None))
    Pool.objects.create(name="warehouse", slots=4)
    task = {"task_id": "a", "bash_command": "true"}
    response = client.post("/admin/orchestrator/dag/add/", dag_post(tasks=[task], default_args='{"pool": "nowhere"}'))
    assert "unknown pool" in errors_of(response)
    response = client.post("/admin/orchestrator/dag/add/", dag_post(tasks=[task], default_args='{"pool_slots": 0}'))
    assert "pool_slots" in errors_of(response)
    assert not Dag.objects.exists()
    defaults = '{"pool": "warehouse", "priority_weight": 3, "circuit": "vendor-api", "trigger_rule": "all_done"}'
    response = client.post("/admin/orchestrator/dag/add/", dag_post(tasks=[task], default_args=defaults))
    assert response.status_code == 302
    assert Dag.objects.get(dag_id="payments").default_args == {"pool": "warehouse", "priority_weight": 3, "circuit": "vendor-api", "trigger_rule": "all_done"}
