"""The registry of operator actions is what the console and the API offer: every registered task
action has its implementation, its API operation (summary, body, permission), its console
route and button, and no other module spells out an action's words."""
from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import timezone

from orchestrator.action_registry import BULK_OFFERS, TASK_ACTIONS
from orchestrator.actions import BULK_ACTIONS, IMPLEMENTATIONS
from tests.api.factories import chain_dag, fail_until_failed, make_run, start

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
TASK = "/dags/{dag_id}/runs/{run_id}/tasks/{task_id}"


def test_every_registered_action_has_its_implementing_function():
    assert list(IMPLEMENTATIONS) == list(TASK_ACTIONS)
    assert set(BULK_ACTIONS) <= set(TASK_ACTIONS)
    assert {offer.action for offer in BULK_OFFERS} <= set(TASK_ACTIONS)


def test_the_api_operations_on_a_task_are_the_registered_actions_as_declared(bob_client):
    document = bob_client.get("/api/v1/openapi.json").json()
    operations = {
        path.removeprefix(f"{TASK}/"): methods["post"]
        for path, methods in document["paths"].items()
        if path.startswith(f"{TASK}/") and "tasks" in methods.get("post", {}).get("tags", ())
    }
    assert list(operations) == list(TASK_ACTIONS)
    for name, action in TASK_ACTIONS.items():
        operation = operations[name]
        assert operation["summary"] == action.summary
        body = operation["requestBody"]["content"]["application/json"]["schema"]["properties"]
        assert set(body) == {"note", "map_index", *(option.name for option in action.options)}
        for option in action.options:
            assert body[option.name]["description"] == option.description


def test_an_api_user_without_an_action_s_permission_is_refused_it(bob_client):
    run = make_run(chain_dag("etl", retries=0))
    fail_until_failed(run, "extract")
    for name in TASK_ACTIONS:
        response = bob_client.post(f"/api/v1/dags/etl/runs/{run.run_id}/tasks/extract/{name}", {}, content_type="application/json")
        assert response.status_code == 403, name


def test_the_console_offers_each_registered_action_with_its_label(alice_client):
    """A failed task offers clear, mark success and reclassify; a running one mark failed."""
    dag = chain_dag("etl", retries=0)
    failed, running = make_run(dag, at=timezone.now() - timedelta(days=1)), make_run(dag)
    fail_until_failed(failed, "extract")
    start(running, "extract")
    offered = set()
    for run in (failed, running):
        html = alice_client.get(f"/dags/etl/runs/{run.run_id}/tasks/extract").content.decode()
        for name, action in TASK_ACTIONS.items():
            if f'id="confirm-{name}-' in html:
                offered.add(name)
                assert f"{action.label}…</summary>" in html
                assert f"Confirm {action.label.lower()}</button>" in html
    assert offered == set(TASK_ACTIONS)
    for name in TASK_ACTIONS:
        assert reverse(f"web:task_{name}", args=["etl", "r", "extract"]) == f"/dags/etl/runs/r/tasks/extract/{name}"


def _declared_words() -> list[str]:
    """An action's words long enough not to occur by chance elsewhere."""
    words = []
    for action in TASK_ACTIONS.values():
        words += [action.summary, action.done.split("{task}")[-1], *(option.description for option in action.options)]
    words += [offer.explanation.split("}")[-1] for offer in BULK_OFFERS]
    return [w.strip(" .:") for w in words if len(w.strip(" .:")) > 20]


def test_no_module_but_the_registry_declares_an_action_s_words():
    sources = [p for p in (ROOT / "orchestrator").rglob("*.py") if p.name != "action_registry.py"]
    sources += list((ROOT / "templates").rglob("*.html"))
    labels = [re.compile(rf"""["']{re.escape(a.label)}["']""") for a in TASK_ACTIONS.values()]
    words = _declared_words()
    for path in sources:
        text = path.read_text()
        assert not [w for w in words if w in text], f"{path} repeats an action's words: declare them in orchestrator/action_registry.py"
        assert not [p.pattern for p in labels if p.search(text)], f"{path} names an action's label"
