"""What every page view shares: htmx polls, permission refusals and lookups that 404."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from orchestrator.exceptions import NotFound

STOP_POLLING = 286  # htmx stops an `every 2s` poll on this status

T = TypeVar("T")


def is_htmx(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true"


def polled(request: HttpRequest, template: str, partial: str, context: dict[str, Any], *, finished: bool) -> HttpResponse:
    """A page that polls itself: an htmx poll gets its `partial`, with status 286 once what it
    shows is finished."""
    if is_htmx(request):
        return TemplateResponse(request, f"{template}#{partial}", context, status=STOP_POLLING if finished else 200)
    return TemplateResponse(request, template, context)


def require(allowed: bool, permission: str) -> None:
    """403 unless `allowed` (an orchestrator.operations.actions permission check)."""
    if not allowed:
        raise PermissionDenied(f"permission '{permission}' required")


def lookup(find: Callable[..., T], *args: Any) -> T:
    """An orchestrator.operations.actions (or backfills) lookup, with NotFound as the 404 page."""
    try:
        return find(*args)
    except NotFound as exc:
        raise Http404(str(exc)) from exc
