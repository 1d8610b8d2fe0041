"""GET /api/v1/openapi.json: generated from the declarations, covering every routed endpoint."""
from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.resolvers import RoutePattern

from orchestrator.api.tokens import create_token
from retries.states import RunState
from tests.api.factories import chain_dag

pytestmark = pytest.mark.django_db

URL = "/api/v1/openapi.json"
PREFIX = "api/v1/"


def _walk(patterns: list, prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for entry in patterns:
        route = str(entry.pattern) if isinstance(entry.pattern, RoutePattern) else None
        if isinstance(entry, URLResolver):
            yield from _walk(entry.url_patterns, prefix + (route or ""))
        elif route is not None:
            yield prefix + route, entry


def api_v1_routes() -> list[tuple[str, URLPattern]]:
    """(OpenAPI path, URL pattern) of every route under /api/v1/, e.g. /dags/{dag_id}."""
    return [
        ("/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route.removeprefix(PREFIX)), pattern)
        for route, pattern in _walk(get_resolver().url_patterns)
        if route.startswith(PREFIX)
    ]


@pytest.fixture
def document(bob_client) -> dict:
    response = bob_client.get(URL)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    return response.json()


def test_every_api_v1_route_is_documented_with_the_operations_its_view_declares(document):
    """Nothing routed under /api/v1 can be left out: each route's view declares its path and methods."""
    routes = api_v1_routes()
    assert len(routes) >= 10
    for path, pattern in routes:
        assert path in document["paths"], f"{path} is routed but not in {URL}"
        operations = getattr(pattern.callback, "operations", ())
        assert operations, f"the view of {path} is not declared with orchestrator.api.decorators.endpoint"
        assert {op.path for op in operations} == {path}, f"{path} is routed to a view declared for another path"
        assert {op.method.lower() for op in operations} == set(document["paths"][path])


def test_every_documented_path_is_routed(document):
    """And the other way round: the document names no path that is not served."""
    assert set(document["paths"]) == {path for path, _ in api_v1_routes()}


def test_it_is_openapi_3_with_bearer_and_session_security(document):
    assert document["openapi"].startswith("3.")
    assert document["servers"] == [{"url": "/api/v1"}]
    assert set(document["components"]["securitySchemes"]) == {"bearerToken", "session"}


def test_it_describes_parameters_from_the_code_that_checks_them(document):
    """The state filter's enum is RunState; limit has the bounds the parser enforces."""
    params = {p["name"]: p for p in document["paths"]["/dags/{dag_id}/runs"]["get"]["parameters"]}
    assert params["dag_id"]["in"] == "path"
    assert params["dag_id"]["required"] is True
    assert params["state"]["schema"]["enum"] == [s.value for s in RunState]
    assert params["limit"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}


def test_it_describes_bodies_permissions_and_errors(document):
    trigger = document["paths"]["/dags/{dag_id}/runs"]["post"]
    assert trigger["requestBody"]["content"]["application/json"]["schema"]["properties"]["conf"]["type"] == ["object", "null"]
    assert "orchestrator.trigger_dagrun" in trigger["description"]
    assert {"201", "400", "401", "403", "404", "409", "413"} <= set(trigger["responses"])
    clear = document["paths"]["/dags/{dag_id}/runs/{run_id}/tasks/{task_id}/clear"]["post"]
    assert "include_downstream" in clear["requestBody"]["content"]["application/json"]["schema"]["properties"]


def test_every_reference_resolves(document):
    refs = set(re.findall(r'"\$ref": "#/components/schemas/(\w+)"', str(document).replace("'", '"')))
    assert refs
    assert refs <= set(document["components"]["schemas"])


def test_it_needs_login_or_a_token(anonymous_client, bob):
    """Like every /api/ URL: 401 JSON when anonymous, the document with a bearer token."""
    refused = anonymous_client.get(URL)
    assert refused.status_code == 401
    assert refused.json()["error"]
    token = create_token(bob)
    assert anonymous_client.get(URL, HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200


def test_a_declared_query_parameter_is_enforced(bob_client):
    """The declaration that documents ?format= also refuses a value it does not list."""
    chain_dag("etl")
    response = bob_client.get("/api/v1/dags/etl/deadlines/history?format=xml")
    assert response.status_code == 400
    assert "invalid format 'xml'" in response.json()["error"]
