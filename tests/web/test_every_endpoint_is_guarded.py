"""Every console URL, read from the URL configuration itself (a new page is covered the day it
is added): an anonymous visitor is sent to log in, whatever the method, and a logged-in viewer
without permissions is refused every action (403) and changes nothing."""
from __future__ import annotations

from datetime import datetime, timezone
from urllib.parse import quote

import pytest
from django.urls import URLPattern, reverse

from orchestrator.models import AuditLog, Backfill, Dag, DagRun, TaskInstance
from orchestrator.operations import backfills
from orchestrator.web import urls
from tests.api.factories import chain_dag, fail, make_run

pytestmark = pytest.mark.django_db

PUBLIC = {"favicon"}  # the browser asks for it before anyone logs in
SAMPLE = {"dag_id": "etl", "task_id": "extract", "token": 1, "stream": "stdout", "fingerprint": "4a7c1d9e02bb"}


def _names() -> list[str]:
    return [p.name for p in urls.urlpatterns if isinstance(p, URLPattern) and p.name and p.name not in PUBLIC]


@pytest.fixture
def world(alice):
    dag = chain_dag("etl")
    dag.schedule = "@daily"
    dag.save()
    run = make_run(dag, at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    fail(run, "extract")
    backfill = backfills.create(backfills.check(dag, start="2025-12-01", end="2025-12-02"), alice)
    return {**SAMPLE, "run_id": run.run_id, "backfill_id": str(backfill.pk)}


def _path(name: str, world: dict) -> str:
    pattern = next(p for p in urls.urlpatterns if isinstance(p, URLPattern) and p.name == name)
    wanted = set(pattern.pattern.regex.groupindex)
    return reverse(f"web:{name}", kwargs={k: v for k, v in world.items() if k in wanted})


def _state() -> tuple:
    """What an action would change."""
    return (
        AuditLog.objects.count(),
        DagRun.objects.count(),
        Backfill.objects.filter(state=Backfill.State.RUNNING).count(),
        sorted(TaskInstance.objects.values_list("state", "try_number")),
        sorted(Dag.objects.values_list("paused", flat=True)),
    )


def test_the_walk_covers_the_console():
    assert {"dag_list", "task_detail", "task_output_file", "task_clear", "dead_letter_action", "backfill_cancel", "workers"} <= set(_names())


@pytest.mark.parametrize("name", _names())
@pytest.mark.parametrize("method", ["get", "post"])
def test_an_anonymous_visitor_is_sent_to_log_in(anonymous_client, world, name, method):
    path = _path(name, world)
    before = _state()
    response = getattr(anonymous_client, method)(path)
    assert response.status_code == 302, f"{method.upper()} {path}: {response.status_code}"
    assert response["Location"] == f"/accounts/login/?next={quote(path, safe='/')}"
    assert _state() == before


@pytest.mark.parametrize("name", _names())
def test_a_viewer_is_refused_every_action(bob_client, world, name):
    """bob has no permission: every form target answers 403 and changes nothing (a page, which
    only reads, answers 405 to a POST)."""
    path = _path(name, world)
    before = _state()
    form = {"confirmed": "1", "scope": "all", "note": "n", "step": "create", "paused": "1", "action": "clear",
            "ids": "1", "from": "2026-01-01", "to": "2026-01-02", "reprocess": "none", "max_active_runs": "1", "conf": ""}
    response = bob_client.post(path, form)
    assert response.status_code in (403, 405), f"POST {path}: {response.status_code}"
    if response.status_code == 405:  # a page: bob may read it
        assert bob_client.get(path).status_code in (200, 404), f"GET {path}"
    assert _state() == before
