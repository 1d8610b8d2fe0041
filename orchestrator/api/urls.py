"""JSON API v1 (session or bearer token): the routes of the ninja application in api.app.

Each route is ninja's view for its path, wrapped so that a method the path does not serve is
answered like every other error: after authentication (401 first), as JSON 405 with Allow.
The wrapper names the operations it serves (`operations`: method and path), which
tests/api/test_openapi.py checks against the document.
"""
from __future__ import annotations

import re
from typing import Any, NamedTuple

from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern
from django.views.decorators.csrf import csrf_exempt

from orchestrator.api.access import authenticate, error_response, method_not_allowed
from orchestrator.api.app import ROUTERS, api

app_name = "api"


class Served(NamedTuple):
    """One operation of a route: its method and its OpenAPI path (/dags/{dag_id})."""

    method: str
    path: str


def _served() -> dict[str, tuple[Served, ...]]:
    """Each route (as Django writes it: dags/<dag_id>) with the operations declared on it."""
    by_route: dict[str, tuple[Served, ...]] = {}
    for router in ROUTERS:
        for path, path_view in router.path_operations.items():
            route = re.sub(r"\{(\w+)\}", r"<\1>", path).lstrip("/")
            by_route[route] = tuple(Served(method, op.path) for op in path_view.operations for method in op.methods)
    return by_route


def _route(pattern: URLPattern, operations: tuple[Served, ...]) -> URLPattern:
    served = pattern.callback
    allowed = [op.method for op in operations]

    @csrf_exempt  # CSRF is checked when authenticating, for session users only
    def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method in allowed:
            return served(request, *args, **kwargs)
        try:
            authenticate(request)
        except Exception as exc:
            response = error_response(exc)
            if response is None:
                raise
            return response
        return method_not_allowed(request, allowed)

    view.operations = operations  # type: ignore[attr-defined]
    return URLPattern(pattern.pattern, view, pattern.default_args, pattern.name)


# ninja's root ("", a page linking its docs) is not part of the API.
urlpatterns = [
    _route(p, _served()[str(p.pattern)]) for p in api.urls[0] if isinstance(p, URLPattern) and p.name != "api-root"
]
