"""Django's error handlers, answering in JSON under /api/ and /metrics and as pages elsewhere.

They cover what fails before or outside an API view: a Host header not in ALLOWED_HOSTS,
a body over DATA_UPLOAD_MAX_MEMORY_SIZE read by middleware, an unexpected exception.
"""
from __future__ import annotations

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse
from django.views import defaults

from orchestrator.api.access import api_view, json_error, too_large


def is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/") or request.path == "/metrics"


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if not is_api(request):
        return defaults.bad_request(request, exception)
    if isinstance(exception, RequestDataTooBig):
        return too_large()
    return json_error(400, "bad request")


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    if not is_api(request):
        return defaults.permission_denied(request, exception)
    return json_error(403, "permission denied")


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if not is_api(request):
        return defaults.page_not_found(request, exception)
    return json_error(404, f"no API endpoint at {request.path}")


@api_view(["GET", "POST", "PUT", "PATCH", "DELETE"])
def not_found(request: HttpRequest) -> HttpResponse:
    """Any other path under /api/: 401 for anonymous clients like the rest, else 404."""
    return json_error(404, f"no API endpoint at {request.path}")


def server_error(request: HttpRequest) -> HttpResponse:
    if not is_api(request):
        return defaults.server_error(request)
    return json_error(500, "internal server error; it has been logged")
