"""Who may call the API (and /metrics), and the JSON errors it answers with.

A request is authenticated by an `Authorization: Bearer TOKEN` header or, without one, by
the Django session. Bearer requests are not subject to CSRF (a browser never adds that
header on its own); session requests that change something must pass Django's CSRF check.
Errors are JSON: `{"error": "..."}` with the matching status, a body too large included (413).

The API's operations authenticate with `Authenticated(permission)` (django-ninja calls it
before it reads any parameter); plain Django views (/metrics, an unknown /api/ path, a
method a path does not serve) with `api_view`.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, cast

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden, JsonResponse, RawPostDataException
from django.http.multipartparser import MultiPartParserError
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from orchestrator.api.tokens import InvalidToken, bearer_key, user_for_key
from orchestrator.exceptions import ActionError, BadRequest
from orchestrator.foundation.sanitise import NotJson, parse_json

View = Callable[..., HttpResponse]
SAFE_METHODS = ("GET", "HEAD", "OPTIONS", "TRACE")


class NotAuthenticated(ActionError):
    status = 401


class PermissionDeniedError(ActionError):
    status = 403


def json_error(status: int, message: str, field: str | None = None) -> JsonResponse:
    body = {"error": message} if field is None else {"error": message, "field": field}
    response = JsonResponse(body, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="orchestrator"'
    return response


def too_large() -> JsonResponse:
    return json_error(413, f"request body too large: at most {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")


# What a request can fail with that is the client's doing, each answered by `error_response`.
ERRORS = (ActionError, RequestDataTooBig, SuspiciousOperation, MultiPartParserError, RawPostDataException)
FORM_REFUSED = "send the fields as a JSON object with Content-Type: application/json"


def error_response(exc: Exception) -> JsonResponse | None:
    """The JSON error for what a request can fail with before or inside a view; None for a bug."""
    if isinstance(exc, ActionError):
        return json_error(exc.status, str(exc), exc.field)
    if isinstance(exc, RequestDataTooBig):
        return too_large()
    if isinstance(exc, SuspiciousOperation):  # e.g. too many form fields
        return json_error(400, f"request refused: {exc}")
    if isinstance(exc, MultiPartParserError):
        return json_error(400, f"malformed multipart body: {exc}")
    if isinstance(exc, RawPostDataException):  # a form body, which the CSRF check has read
        return json_error(400, FORM_REFUSED)
    return None


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


def authenticate(request: HttpRequest, *, checks_permissions: bool = False) -> Any:
    """The user of a bearer token, else the session's (CSRF-checked when it changes something).
    `checks_permissions`: a permission will be checked, so a token's user comes with them.

    Raises NotAuthenticated (401) or, for a session request failing the CSRF check, 403.
    """
    try:
        key = bearer_key(request)
        if key is not None:
            request.user = cast(User, user_for_key(key, with_permissions=checks_permissions))  # any user model; Django types it as its own
            return request.user
    except InvalidToken as exc:
        raise NotAuthenticated(str(exc)) from None
    if not request.user.is_authenticated:
        raise NotAuthenticated("authentication required: log in or send 'Authorization: Bearer TOKEN'")
    if request.method not in SAFE_METHODS:
        reason = _csrf_failure(request)
        if reason:
            raise PermissionDeniedError(f"CSRF check failed: {reason}")
    return request.user


def require_perm(request: HttpRequest, perm: str) -> None:
    if not request.user.has_perm(perm):
        raise PermissionDeniedError(f"permission '{perm}' required")


class Authenticated:
    """django-ninja's auth for every API operation: `authenticate`, then the operation's permission."""

    def __init__(self, permission: str | None = None) -> None:
        self.permission = permission

    def __call__(self, request: HttpRequest) -> Any:
        user = authenticate(request, checks_permissions=bool(self.permission))
        if self.permission:
            require_perm(request, self.permission)
        return user


def method_not_allowed(request: HttpRequest, allowed: Iterable[str]) -> JsonResponse:
    """405 naming the methods the path serves, after authentication like any other answer."""
    methods = ", ".join(allowed)
    response = json_error(405, f"method {request.method} not allowed; use {methods}")
    response["Allow"] = methods
    return response


def api_view(methods: Iterable[str]) -> Callable[[View], View]:
    """A plain Django view under the API's rules: authenticate, allow only `methods`, JSON errors."""
    allowed = tuple(m.upper() for m in methods)

    def decorate(view: View) -> View:
        @csrf_exempt  # CSRF is checked in authenticate, for session users only
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                authenticate(request)  # reads a session user's form body for the CSRF check
                if request.method not in allowed:
                    return method_not_allowed(request, allowed)
                return view(request, *args, **kwargs)
            except Exception as exc:
                response = error_response(exc)
                if response is None:
                    raise
                return response

        return wrapper

    return decorate


def json_body(request: HttpRequest) -> dict[str, Any]:
    """The request's JSON object body; an empty body (or an empty form) is `{}`."""
    if request.content_type in ("multipart/form-data", "application/x-www-form-urlencoded"):
        if request.POST or request.FILES:
            raise BadRequest(FORM_REFUSED)
        return {}
    if not request.body.strip():
        return {}
    try:
        # NaN, Infinity, numbers too large: refused as every conf typed anywhere is.
        body = parse_json(request.body)
    except NotJson as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    return body
