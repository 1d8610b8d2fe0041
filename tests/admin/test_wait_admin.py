"""`wait_for` in the admin: edited on the DAG page's task rows and on a task's own page, held to
the import's rules (the same validator), and exported as written so an import changes nothing."""
from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command
from django.utils.html import escape

from orchestrator.models import AuditLog, Dag, Task
from tests.admin.conftest import DEADLINE_ROW, TASK_ROW, dag_post, errors_of, formset
from tests.specs.conftest import snapshot

pytestmark = pytest.mark.django_db

ADD_URL = "/admin/orchestrator/dag/add/"
WAITS = {
    "at": {"time": "2026-12-01T06:00:00"},
    "later": {"time_after_logical_date": 3600},
    "upstream": {"dag_run": {"dag_id": "not_yet", "task_id": "publish", "offset": -86400}},
    "ready": {"http": {"url": "https://partner.example/ready", "status": 200, "contains": "ready"}},
    "landed": {"event": {"name": "orders_landed"}},
    "ok": {"approval": {"message": "Publish?", "approvers": ["finance"]}},
}


@pytest.fixture(autouse=True)
def allowed_hosts(settings):
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["partner.example"]


def wait_rows() -> list[dict]:
    rows = [{"task_id": task_id, "wait_for": json.dumps(wait)} for task_id, wait in WAITS.items()]
    rows[0]["args"] = '{"poke_interval": 30, "wait_timeout": 3600}'
    rows[-1]["upstream"] = "landed"
    rows.append({"task_id": "publish", "bash_command": "echo published", "upstream": "ok, ready"})
    return rows


@pytest.fixture
def waiting(admin_client) -> Dag:
    response = admin_client.post(ADD_URL, dag_post("waiting", tasks=wait_rows()))
    assert response.status_code == 302, errors_of(response)
    return Dag.objects.get(dag_id="waiting")


def change_url(dag: Dag) -> str:
    return f"/admin/orchestrator/dag/{dag.pk}/change/"


def existing_rows(dag: Dag) -> list[dict]:
    """The task rows as the change page renders them (and a browser sends them back)."""
    rows = []
    for task in dag.tasks.order_by("position"):
        rows.append(
            {
                "id": str(task.pk),
                "dag": str(dag.pk),
                "task_id": task.task_id,
                "python_callable": task.python_callable,
                "bash_command": task.bash_command,
                "wait_for": json.dumps(task.wait_for) if task.wait_for else "",
                "upstream": ", ".join(task.upstream),
                "trigger_rule": task.trigger_rule,
                "args": json.dumps(task.args),
            }
        )
    return rows


def test_it_saves_each_kind_of_wait_and_warns_of_an_awaited_dag_not_defined_yet(admin_client) -> None:
    """Every kind is saved as written, with its poke_interval; a dag_run on an unknown DAG is a warning."""
    response = admin_client.post(ADD_URL, dag_post("waiting", tasks=wait_rows()), follow=True)
    assert response.redirect_chain, errors_of(response)
    tasks = {task.task_id: task for task in Dag.objects.get(dag_id="waiting").tasks.all()}
    assert {task_id: tasks[task_id].wait_for for task_id in WAITS} == WAITS
    assert tasks["at"].args == {"poke_interval": 30, "wait_timeout": 3600}
    assert tasks["at"].python_callable == tasks["at"].bash_command == ""
    assert tasks["publish"].wait_for is None
    shown = [str(message) for message in response.context["messages"]]
    assert [text for text in shown if text.startswith("warning:")] == [
        "warning: task 'upstream': wait_for.dag_run.dag_id: DAG 'not_yet' is not defined (yet);"
        " the task waits until a run of it succeeds"
    ]


def test_the_change_page_shows_the_wait_and_saving_it_unchanged_keeps_the_tasks(admin_client, waiting) -> None:
    page = admin_client.get(change_url(waiting)).content.decode()
    assert 'name="tasks-4-wait_for"' in page
    assert "orders_landed" in page
    before = [row for row in snapshot() if row[0] == "Task"]
    response = admin_client.post(change_url(waiting), dag_post("waiting", tasks=existing_rows(waiting)))
    assert response.status_code == 302, errors_of(response)
    assert [row for row in snapshot() if row[0] == "Task"] == before


@pytest.mark.parametrize(
    ("row", "field", "shown"),
    [
        ({"wait_for": '{"event": {"name": "x"}, "time": "2026-01-01"}'}, "wait_for", "must be a mapping with exactly one of"),
        ({"wait_for": '{"sleep": 5}'}, "wait_for", "unknown kind 'sleep'"),
        ({"wait_for": '["event"]'}, "wait_for", "must be a mapping with exactly one of"),
        ({"wait_for": "{not json"}, "wait_for", "Enter a valid JSON"),
        ({"wait_for": '{"time": "tomorrow"}'}, "wait_for", "wait_for.time: invalid ISO 8601"),
        ({"wait_for": '{"time_after_logical_date": "1h"}'}, "wait_for", "wait_for.time_after_logical_date: must be a number"),
        ({"wait_for": '{"dag_run": {"dag_id": "bad id!"}}'}, "wait_for", "wait_for.dag_run.dag_id: must be a DAG id"),
        ({"wait_for": '{"dag_run": {"dag_id": "x", "ofset": 5}}'}, "wait_for", "wait_for.dag_run.ofset: unknown key"),
        ({"wait_for": '{"http": {"url": "https://evil.example/ready"}}'}, "wait_for", "ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS"),
        ({"wait_for": '{"http": {"url": "ftp://partner.example/ready"}}'}, "wait_for", "wait_for.http.url: must be an http(s) URL"),
        ({"wait_for": '{"http": {"url": "https://partner.example/", "status": 42}}'}, "wait_for", "wait_for.http.status"),
        ({"wait_for": '{"event": {"name": ""}}'}, "wait_for", "wait_for.event.name: must be a name"),
        ({"wait_for": json.dumps({"event": {"name": "x" * 251}})}, "wait_for", "wait_for.event.name: must be a name"),
        ({"wait_for": '{"event": {"name": "a\\u0000b"}}'}, "wait_for", "wait_for.event.name: must not contain the NUL"),
        ({"wait_for": '{"approval": {"approvers": "finance"}}'}, "wait_for", "wait_for.approval.approvers: must be a list"),
        ({"args": '{"poke_interval": 0.5}'}, "args", "poke_interval: must be a number of seconds >= 1"),
        ({"args": '{"wait_timeout": 0}'}, "args", "wait_timeout: must be a number of seconds > 0"),
        ({"python_callable": "tests.worker.tasks.succeed"}, "__all__", "set exactly one of python_callable or bash_command (or wait_for)"),
        ({"bash_command": "sleep 3600"}, "__all__", "set exactly one of python_callable or bash_command (or wait_for)"),
    ],
)
def test_it_refuses_a_bad_wait_on_the_field_and_changes_nothing(admin_client, waiting, row, field, shown) -> None:
    """Each wait the import refuses is refused here, on the field it names, and nothing is written."""
    before, audited = snapshot(), AuditLog.objects.count()
    rows = existing_rows(waiting)
    landed = next(i for i, r in enumerate(rows) if r["task_id"] == "landed")
    rows[landed].update(row)
    response = admin_client.post(change_url(waiting), dag_post("waiting", tasks=rows))
    errors_of(response)
    (tasks,) = [inline.formset for inline in response.context["inline_admin_formsets"] if inline.formset.prefix == "tasks"]
    errors = tasks.forms[landed].errors
    assert field in errors, errors
    assert shown in " ".join(errors[field])
    assert escape(shown) in response.content.decode()
    assert snapshot() == before
    assert AuditLog.objects.count() == audited


def test_an_edited_wait_exports_as_written_and_an_import_changes_nothing(admin_client, waiting, tmp_path: Path) -> None:
    rows = existing_rows(waiting)
    rows[4]["wait_for"] = '{"event": {"name": "orders_reconciled"}}'
    rows[2]["wait_for"] = '{"dag_run": {"dag_id": "waiting", "offset": -86400}}'
    response = admin_client.post(change_url(waiting), dag_post("waiting", tasks=rows))
    assert response.status_code == 302, errors_of(response)
    before = [row for row in snapshot() if row[0] == "Task"]
    out = StringIO()
    call_command("export_dags", "waiting", stdout=out)
    (exported,) = yaml.safe_load(out.getvalue())
    assert {task["task_id"]: task.get("wait_for") for task in exported["tasks"]} == {
        **WAITS,
        "upstream": {"dag_run": {"dag_id": "waiting", "offset": -86400}},
        "landed": {"event": {"name": "orders_reconciled"}},
        "publish": None,
    }
    path = tmp_path / "exported.yaml"
    path.write_text(out.getvalue())
    imported = StringIO()
    call_command("import_dags", str(path), stdout=imported)
    assert "0 created, 0 updated, 1 unchanged" in imported.getvalue()
    assert [row for row in snapshot() if row[0] == "Task"] == before


def task_post(task: Task, **fields: str) -> dict:
    """The task's own page, as a browser sends it back (then `fields` changed)."""
    data = {
        **TASK_ROW,
        "task_id": task.task_id,
        "wait_for": json.dumps(task.wait_for) if task.wait_for else "",
        "upstream": ", ".join(task.upstream),
        "trigger_rule": task.trigger_rule,
        "position": str(task.position),
        "args": json.dumps(task.args),
        **fields,
    }
    data.update(formset("deadline_definitions", [], DEADLINE_ROW))
    return data


def test_a_task_page_holds_its_wait_to_the_same_rules(admin_client, waiting) -> None:
    task = waiting.tasks.get(task_id="ready")
    url = f"/admin/orchestrator/task/{task.pk}/change/"
    before = snapshot()
    response = admin_client.post(url, task_post(task, wait_for='{"http": {"url": "http://169.254.169.254/latest"}}'))
    assert "ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS" in str(response.context["adminform"].form.errors["wait_for"])
    response = admin_client.post(url, task_post(task, python_callable="tests.worker.tasks.succeed"))
    assert "exactly one of python_callable" in errors_of(response)
    assert snapshot() == before

    response = admin_client.post(url, task_post(task, wait_for='{"http": {"url": "http://partner.example:8080/ok"}}'))
    assert response.status_code == 302, errors_of(response)
    task.refresh_from_db()
    assert task.wait_for == {"http": {"url": "http://partner.example:8080/ok"}}
    assert admin_client.get("/admin/orchestrator/task/").content.decode().count(">wait</td>") == len(WAITS)
