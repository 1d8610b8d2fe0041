"""The registry of operator actions is what the console and the API offer: every registered action
has its implementation, its API operation (summary, body, permission), its console control with
its label, and no other module or template spells out an action's label or words."""
from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.template.loader import render_to_string
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from orchestrator.console.mapped import bulk_choices
from orchestrator.models import Backfill, TaskInstance
from orchestrator.operations import backfills
from orchestrator.operations.action_registry import (
    APPROVAL_ACTIONS,
    APPROVAL_NOTE,
    BACKFILL_ACTIONS,
    CIRCUIT_ACTIONS,
    CIRCUIT_NOTE,
    DAG_ACTIONS,
    DEAD_LETTER_OFFERS,
    MAPPED_TASK_OFFERS,
    RUN_OFFERS,
    TASK_ACTIONS,
    TASK_MAP_INDEX,
    TASK_NOTE,
)
from orchestrator.operations.actions import BULK_ACTIONS, IMPLEMENTATIONS
from tests.api.factories import chain_dag, fail_until_failed, make_run, start
from tests.web.test_dead_letters_page import dead_letter

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
TASK = "/dags/{dag_id}/runs/{run_id}/tasks/{task_id}"
# Each kind of action the API offers: where, under which tag, and what its body carries besides options.
API_KINDS = [
    (TASK, "tasks", TASK_ACTIONS, {"note": TASK_NOTE, "map_index": TASK_MAP_INDEX}),
    (TASK, "waits", APPROVAL_ACTIONS, {"note": APPROVAL_NOTE, "map_index": None}),
    ("/backfills/{id}", "backfills", BACKFILL_ACTIONS, {}),
    ("/circuits/{name}", "limits", CIRCUIT_ACTIONS, {"note": CIRCUIT_NOTE}),
]
EVERY_OFFER = MAPPED_TASK_OFFERS + RUN_OFFERS + DEAD_LETTER_OFFERS
# Operations beside the actions under the same path and tag that are not an operator's action:
# an event is what a system sends a task waiting for it.
NOT_ACTIONS = {"events"}


def test_every_registered_action_has_its_implementing_function():
    assert list(IMPLEMENTATIONS) == list(TASK_ACTIONS)
    assert set(BULK_ACTIONS) <= set(TASK_ACTIONS)
    assert {offer.action for offer in EVERY_OFFER} <= set(TASK_ACTIONS)
    assert list(backfills.MOVES_TO) == list(BACKFILL_ACTIONS)


@pytest.mark.parametrize(("path", "tag", "registered", "body_fields"), API_KINDS, ids=[kind[1] for kind in API_KINDS])
def test_the_api_operations_are_the_registered_actions_as_declared(bob_client, path, tag, registered, body_fields):
    document = bob_client.get("/api/v1/openapi.json").json()
    operations = {
        route.removeprefix(f"{path}/"): methods["post"]
        for route, methods in document["paths"].items()
        if route.startswith(f"{path}/") and tag in methods.get("post", {}).get("tags", ())
    }
    operations = {name: operation for name, operation in operations.items() if name not in NOT_ACTIONS}
    assert {name: op["summary"] for name, op in operations.items()} == {name: a.summary for name, a in registered.items()}
    for name, action in registered.items():
        assert f"Needs the permission `{action.permission}`." in operations[name]["description"]
        body = operations[name]["requestBody"]["content"]["application/json"]["schema"]["properties"]
        options = {o.name: o.description for o in getattr(action, "options", ())}
        assert set(body) == {*body_fields, *options}
        for field, description in {**body_fields, **options}.items():
            if description is not None:
                assert body[field]["description"] == description


@pytest.mark.parametrize(("path", "registered"), [
    ("/api/v1/dags/etl/runs/r/tasks/extract", TASK_ACTIONS),
    ("/api/v1/dags/etl/runs/r/tasks/extract", APPROVAL_ACTIONS),
    ("/api/v1/backfills/1", BACKFILL_ACTIONS),
    ("/api/v1/circuits/payments", CIRCUIT_ACTIONS),
])  # fmt: skip
def test_an_api_user_without_an_action_s_permission_is_refused_it(bob_client, path, registered):
    for name in registered:
        response = bob_client.post(f"{path}/{name}", {}, content_type="application/json")
        assert response.status_code == 403, name
        assert registered[name].permission in response.json()["error"]


def test_the_console_offers_each_task_action_with_its_label_and_options(alice_client):
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
                for option in action.options:
                    assert f'name="{option.name}" value="1"> {option.label}</label>' in html
    assert offered == set(TASK_ACTIONS)
    for name in TASK_ACTIONS:
        assert reverse(f"web:task_{name}", args=["etl", "r", "extract"]) == f"/dags/etl/runs/r/tasks/extract/{name}"


def _confirmed(html: str, label: str, confirm: str | None = None) -> bool:
    """The page has a control `label…` confirmed by `Confirm <confirm, lower case>`."""
    return f"{label}…</summary>" in html and f"Confirm {(confirm or label).lower()}</button>" in html


def test_the_run_page_offers_its_bulk_actions_with_their_labels(alice_client):
    run = make_run(chain_dag("etl", retries=0))
    fail_until_failed(run, "extract")
    html = alice_client.get(f"/dags/etl/runs/{run.run_id}/").content.decode()
    for offer in RUN_OFFERS:
        assert _confirmed(html, offer.label)
        assert f"{offer.label}: {offer.explanation}" in html


def test_the_dead_letters_page_offers_its_bulk_actions_with_their_labels(alice_client):
    dead_letter(make_run(chain_dag("etl", retries=9, poison_threshold=2)))
    html = alice_client.get("/dead-letters/").content.decode()
    for offer in DEAD_LETTER_OFFERS:
        action = TASK_ACTIONS[offer.action]
        assert _confirmed(html, offer.label.format(n=1), confirm=action.label)
        assert f"{action.label}: {offer.explanation.format(n=1)}" in html


def test_a_mapped_task_page_offers_its_bulk_actions_with_their_labels():
    counts = {"failed": 2, "success": 1}
    allowed = {"failed": list(TASK_ACTIONS), "success": list(TASK_ACTIONS)}
    choices = bulk_choices(counts, "/dags/etl/runs/r/tasks/each", allowed)
    assert [(c.name, c.scope) for c in choices] == [(o.action, o.scope) for o in MAPPED_TASK_OFFERS]
    for offer, choice in zip(MAPPED_TASK_OFFERS, choices, strict=True):
        html = render_to_string("web/_bits.html#bulk_action", {"choice": choice})
        label = offer.label.format(n=3, f=2)
        assert f"{label}…</summary>" in html
        assert f"Confirm: {label.lower()}</button>" in html


def test_the_backfill_page_offers_the_actions_its_state_allows_with_their_labels(alice_client):
    dag = chain_dag("etl")
    now = timezone.now()
    offered = set()
    for state in (Backfill.State.RUNNING, Backfill.State.PAUSED, Backfill.State.SUCCESS):
        backfill = Backfill.objects.create(dag=dag, state=state, from_date=now, to_date=now, created_at=now)
        html = alice_client.get(f"/backfills/{backfill.pk}/").content.decode()
        for name, action in BACKFILL_ACTIONS.items():
            shown = f'id="backfill-{name}"' in html
            assert shown == (state in action.allowed_from), (state, name)
            if shown and action.explain:
                offered.add(name)
                assert _confirmed(html, action.label)
                assert f"{action.label}: {action.explain(0)}" in html
            elif shown:
                offered.add(name)
                assert f'id="backfill-{name}">{action.label}</button>' in html
    assert offered == set(BACKFILL_ACTIONS)


def test_the_task_page_offers_the_approval_decisions_with_their_labels():
    run = make_run(chain_dag("etl"))
    TaskInstance.objects.filter(dag_run=run, task_id="extract").update(state="up_for_reschedule", waiting_for={"name": "approval"})
    approver = User.objects.create_user("carol")
    approver.user_permissions.add(Permission.objects.get(codename="approve_taskinstance"))
    client = Client()
    client.force_login(approver)
    html = client.get(f"/dags/etl/runs/{run.run_id}/tasks/extract").content.decode()
    for name, action in APPROVAL_ACTIONS.items():
        assert f'id="approval-{name}"' in html
        assert _confirmed(html, action.label)
        assert f"{action.label}: {action.explanation}" in html


def test_the_dag_page_offers_its_actions_with_their_labels(alice_client):
    chain_dag("etl")
    html = alice_client.get("/dags/etl/").content.decode()
    assert f">{DAG_ACTIONS['trigger'].label}</button>" in html
    assert f">{DAG_ACTIONS['pause'].label}</button>" in html


# --- no one else spells an action's words -----------------------------------------------------------


def _labels() -> list[str]:
    labels = [a.label for registered in (TASK_ACTIONS, APPROVAL_ACTIONS, BACKFILL_ACTIONS, DAG_ACTIONS) for a in registered.values()]
    labels += [offer.label for offer in EVERY_OFFER]
    labels += [option.label for action in TASK_ACTIONS.values() for option in action.options]
    return list(dict.fromkeys(labels))


def _declared_words() -> list[str]:
    """An action's words long enough not to occur by chance elsewhere (the pieces between its
    placeholders and semicolons)."""
    texts = [TASK_NOTE, TASK_MAP_INDEX, APPROVAL_NOTE, CIRCUIT_NOTE]
    for registered in (TASK_ACTIONS, APPROVAL_ACTIONS, BACKFILL_ACTIONS, CIRCUIT_ACTIONS):
        texts += [action.summary for action in registered.values()]
    for action in TASK_ACTIONS.values():
        texts += [action.done, *(option.description for option in action.options)]
    texts += [action.explanation for action in APPROVAL_ACTIONS.values()]
    texts += [action.explain(2) for action in BACKFILL_ACTIONS.values() if action.explain]
    texts += [offer.explanation for offer in EVERY_OFFER]
    pieces = [piece.strip(" .:,") for text in texts for piece in re.split(r"\{[^}]*\}|;| 2 ", text)]
    return [piece for piece in pieces if len(piece) > 20]


def _spelt_in_python(label: str) -> re.Pattern[str]:
    return re.compile(rf"""["']{re.escape(label)}["']""")


def _spelt_in_a_template(label: str) -> re.Pattern[str]:
    """The label as an element's text or a confirmation's, a count in it as any {{ variable }}."""
    text = re.escape(label).replace(r"\{n\}", r"\{\{[^}]*\}\}").replace(r"\{f\}", r"\{\{[^}]*\}\}")
    lower = re.escape(label.lower()).replace(r"\{n\}", r"\{\{[^}]*\}\}").replace(r"\{f\}", r"\{\{[^}]*\}\}")
    return re.compile(rf">\s*{text}…?\s*<|Confirm:? {lower}<|{text}: |yesno:[^>]*\b{text}\b")


def _spellings(path: Path) -> list[str]:
    text = path.read_text()
    spelt = _spelt_in_a_template if path.suffix == ".html" else _spelt_in_python
    return [w for w in _declared_words() if w in text] + [label for label in _labels() if spelt(label).search(text)]


def test_no_module_or_template_but_the_registry_spells_an_action_s_label_or_words():
    sources = [p for p in (ROOT / "orchestrator").rglob("*.py") if p.name != "action_registry.py"]
    sources += list((ROOT / "templates").rglob("*.html"))
    for path in sources:
        assert not _spellings(path), f"{path} spells an action's words: declare them in orchestrator/operations/action_registry.py"


def test_the_check_finds_a_label_written_in_a_template(tmp_path):
    """As the run page did before the registry declared its bulk action."""
    page = tmp_path / "run_detail.html"
    page.write_text('<summary class="button">Clear all failed…</summary><button>Confirm clear all failed</button>')
    assert _spellings(page) == ["Clear all failed"]
    page.write_text('<summary class="button">Clear all {{ group.count }}…</summary>')
    assert _spellings(page) == ["Clear all {n}"]
