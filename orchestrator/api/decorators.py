"""How every API endpoint (and /metrics) authenticates, checks methods and reports errors.

A request is authenticated by an `Authorization: Bearer TOKEN` header or, without one, by
the Django session. Bearer requests are not subject to CSRF (a browser never adds that
header on its own); session requests that change something must pass Django's CSRF check.
Errors are JSON: `{"error": "..."}` with the matching status, a body too large included (413).

`endpoint(Operation(...))` declares an endpoint: the same declaration authenticates, checks the
permission, path, query and body, and describes the endpoint in /api/v1/openapi.json.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from typing import Any, cast

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from orchestrator.api.declarations import Operation, register
from orchestrator.api.validation import validate
from orchestrator.auth import InvalidToken, bearer_key, user_for_key
from orchestrator.exceptions import ActionError, BadRequest
from orchestrator.querystring import check_text, read_query

View = Callable[..., HttpResponse]


class PermissionDeniedError(ActionError):
    status = 403


def json_error(status: int, message: str) -> JsonResponse:
    response = JsonResponse({"error": message}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="orchestrator"'
    return response


def too_large() -> JsonResponse:
    return json_error(413, f"request body too large: at most {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")


class _CsrfCheck(CsrfViewMiddleware):
    """Django's own CSRF check, keeping the failure reason for the JSON error."""

    reason = ""

    def _reject(self, request: HttpRequest, reason: str) -> HttpResponse:
        self.reason = reason
        return HttpResponseForbidden(reason)


def _checked_view(request: HttpRequest) -> HttpResponse:
    """Stands for the API view in the CSRF check (which only reads its csrf_exempt flag)."""
    return HttpResponse()


def _csrf_failure(request: HttpRequest) -> str | None:
    check = _CsrfCheck(_checked_view)
    check.process_request(request)
    return check.reason if check.process_view(request, _checked_view, (), {}) is not None else None


def _authenticate(request: HttpRequest) -> JsonResponse | None:
    """Set request.user from a bearer token or keep the session's; an error response if neither."""
    try:
        key = bearer_key(request)
        if key is not None:
            request.user = cast(User, user_for_key(key))  # any user model; Django types it as its own
            request.auth_via_token = True  # type: ignore[attr-defined]
            return None
    except InvalidToken as exc:
        return json_error(401, str(exc))
    request.auth_via_token = False  # type: ignore[attr-defined]
    if not request.user.is_authenticated:
        return json_error(401, "authentication required: log in or send 'Authorization: Bearer TOKEN'")
    if request.method not in ("GET", "HEAD", "OPTIONS", "TRACE"):
        reason = _csrf_failure(request)
        if reason:
            return json_error(403, f"CSRF check failed: {reason}")
    return None


def api_view(methods: Iterable[str]) -> Callable[[View], View]:
    """Authenticate, allow only `methods`, and turn ActionError into its JSON error."""
    allowed = tuple(m.upper() for m in methods)

    def decorate(view: View) -> View:
        @csrf_exempt  # CSRF is checked in _authenticate, for session users only
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                return _serve(view, allowed, request, *args, **kwargs)
            except ActionError as exc:
                return json_error(exc.status, str(exc))
            except RequestDataTooBig:
                return too_large()
            except SuspiciousOperation as exc:  # e.g. too many form fields
                return json_error(400, f"request refused: {exc}")
            except MultiPartParserError as exc:
                return json_error(400, f"malformed multipart body: {exc}")

        return wrapper

    return decorate


def _serve(view: View, allowed: tuple[str, ...], request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    denied = _authenticate(request)  # reads a session user's form body for the CSRF check
    if denied is not None:
        return denied
    if request.method not in allowed:
        response = json_error(405, f"method {request.method} not allowed; use {', '.join(allowed)}")
        response["Allow"] = ", ".join(allowed)
        return response
    return view(request, *args, **kwargs)


def require_perm(request: HttpRequest, perm: str) -> None:
    if not request.user.has_perm(perm):
        raise PermissionDeniedError(f"permission '{perm}' required")


def _refuse_constant(name: str) -> Any:
    """NaN and Infinity are not JSON (Python's parser takes them; PostgreSQL's jsonb does not)."""
    raise json.JSONDecodeError(f"{name} is not a JSON value", name, 0)


def json_body(request: HttpRequest) -> dict[str, Any]:
    """The request's JSON object body; an empty body (or an empty form) is `{}`."""
    if request.content_type in ("multipart/form-data", "application/x-www-form-urlencoded"):
        if request.POST or request.FILES:
            raise BadRequest("send the fields as a JSON object with Content-Type: application/json")
        return {}
    if not request.body.strip():
        return {}
    try:
        body = json.loads(request.body, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise BadRequest("request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    return body


def endpoint(operation: Operation) -> Callable[[View], View]:
    """Declare `operation` and serve it with the decorated handler.

    The handler runs only for an authenticated user with `operation.permission`, path
    parameters free of NUL, and is called with `query=` (the declared query parameters,
    parsed) when the operation has any, and `body=` (the JSON body, checked against
    `operation.body`) when it declares one.
    """

    def decorate(handler: View) -> View:
        register(operation)
        serve = _checked(operation, handler)
        view = api_view([operation.method])(serve)
        view.operations = (operation,)  # type: ignore[attr-defined]
        view.serve = serve  # type: ignore[attr-defined]
        return view

    return decorate


def route(*views: View) -> View:
    """One URL whose methods are declared by several endpoints (GET and POST on one path)."""
    by_method: dict[str, View] = {op.method: v.serve for v in views for op in v.operations}  # type: ignore[attr-defined]

    def dispatch(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return by_method[request.method or "GET"](request, *args, **kwargs)

    view = api_view(by_method)(dispatch)
    view.operations = tuple(op for v in views for op in v.operations)  # type: ignore[attr-defined]
    return view


def _checked(operation: Operation, handler: View) -> View:
    @functools.wraps(handler)
    def serve(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if operation.permission:
            require_perm(request, operation.permission)
        for name in operation.path_params:
            check_text(name, kwargs[name])
        declared: dict[str, Any] = {}
        if operation.query:
            declared["query"] = read_query(request.GET, operation.query)
        if operation.body is not None:
            declared["body"] = validate(json_body(request), operation.body, "")
        return handler(request, *args, **kwargs, **declared)

    return serve
