"""The JSON API under random and malformed input: always a JSON answer with a clear status
(2xx, 400, 401/403, 404, 405, 413), never a 500, never a half-made run."""
from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.models import DagRun, TaskInstance
from tests.api.factories import chain_dag

pytestmark = pytest.mark.django_db

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
ALLOWED = {200, 201, 400, 403, 404, 405, 409, 413}

json_value = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80) | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=25,
)
nasty = st.one_of(st.text(max_size=40), st.sampled_from(["<script>alert(1)</script>", "é\u200b🚀", "..", "%00", "a/b", "' OR 1=1 --", "\ud800"]))


@pytest.fixture
def etl(db):
    return chain_dag("etl")


def _check(response) -> None:
    assert response.status_code in ALLOWED, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    json.loads(response.content)


def _runs_whole() -> None:
    """A run exists only with all its task instances."""
    for run in DagRun.objects.all():
        assert TaskInstance.objects.filter(dag_run=run).count() == run.dag.tasks.count()


@FUZZ
@given(body=st.one_of(st.binary(max_size=300), json_value.map(lambda v: json.dumps(v).encode()), st.builds(lambda c: json.dumps({"conf": c}).encode(), json_value)))
def test_trigger_with_random_bodies(alice_client, etl, body):
    response = alice_client.post("/api/v1/dags/etl/runs", body, content_type="application/json")
    _check(response)
    if response.status_code == 201:
        document = response.json()
        if not body.strip():
            return  # an empty body is an empty JSON object: a run with no conf
        sent = json.loads(body)
        assert document["conf"] == sent.get("conf") or (sent.get("conf") is None and document["conf"] in (None, {}))
    _runs_whole()


@FUZZ
@given(conf=st.dictionaries(nasty, nasty, max_size=5))
def test_unicode_and_html_in_conf_come_back_verbatim(alice_client, etl, conf):
    body = json.dumps({"conf": conf})
    response = alice_client.post("/api/v1/dags/etl/runs", body, content_type="application/json")
    _check(response)
    if response.status_code == 201:
        assert response.json()["conf"] == conf
        run_id = response.json()["run_id"]
        again = alice_client.get(f"/api/v1/dags/etl/runs/{quote(run_id, safe='')}")
        _check(again)
        assert again.json()["conf"] == conf
    else:
        assert any("\x00" in k or "\x00" in v or "\ud800" in k or "\ud800" in v for k, v in conf.items()), response.json()


@FUZZ
@given(dag_id=nasty, run_id=nasty, task_id=nasty, action=st.sampled_from(["clear", "mark_success", "mark_failed", "reclassify"]))
def test_random_ids_in_paths(alice_client, etl, dag_id, run_id, task_id, action):
    q = lambda s: quote(s.encode("utf-8", "surrogatepass"), safe="")  # noqa: E731
    for path in (f"/api/v1/dags/{q(dag_id)}", f"/api/v1/dags/{q(dag_id)}/runs", f"/api/v1/dags/etl/runs/{q(run_id)}"):
        _check(alice_client.get(path))
    _check(alice_client.post(f"/api/v1/dags/etl/runs/{q(run_id)}/tasks/{q(task_id)}/{action}", "{}", content_type="application/json"))


@FUZZ
@given(params=st.dictionaries(st.sampled_from(["category", "reason", "dag_id", "since", "limit", "last", "x"]), nasty, max_size=4))
def test_random_query_parameters(alice_client, etl, params):
    _check(alice_client.get("/api/v1/failures", {k: v.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for k, v in params.items()}))
    _check(alice_client.get("/api/v1/dags/etl/runs", {k: v.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for k, v in params.items()}))


def test_an_oversized_body_is_a_json_413_and_creates_nothing(alice_client, etl, settings):
    body = json.dumps({"conf": {"blob": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 10)}})
    response = alice_client.post("/api/v1/dags/etl/runs", body, content_type="application/json")
    assert response.status_code == 413
    _check(response)
    assert not DagRun.objects.exists()


def test_a_deeply_nested_conf_is_a_clear_error_or_stored(alice_client, etl):
    body = '{"conf": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}"
    response = alice_client.post("/api/v1/dags/etl/runs", body, content_type="application/json")
    _check(response)
    _runs_whole()
