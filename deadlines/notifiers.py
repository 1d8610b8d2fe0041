"""Built-in notifiers: `notifier:log`, `notifier:email`, `notifier:webhook`.

Each takes the callback context (see deadlines.callbacks.build_context) and the deadline's
callback_kwargs. A problem the next attempt cannot fix (a host not allowed, no recipients)
raises NotifierError with `permanent=True`, so the callback is not retried for it.
"""
from __future__ import annotations

import inspect
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.mail import get_connection, send_mail

log = logging.getLogger("deadlines.notifier")

PREFIX = "notifier:"
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
# Responses that another attempt may well turn around.
TRANSIENT_HTTP = frozenset({408, 425, 429})


class NotifierError(Exception):
    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


Notifier = Callable[..., None]


def headline(context: Mapping[str, Any]) -> str:
    """One line naming what is (about to be) late, for subjects and log lines."""
    what = f"{context['dag_id']}.{context['task_id']}" if context.get("task_id") else context["dag_id"]
    if context.get("at_risk"):
        return f"[deadline at risk] {what} ({context['run_id']}) may miss {context['need_by']}"
    return f"[deadline missed] {what} ({context['run_id']}) missed {context['need_by']} by {context['lateness_seconds']:.0f}s"


def log_notifier(context: Mapping[str, Any], *, timeout: float, level: str = "warning", message: str = "") -> None:
    """Write the headline and the whole context (as JSON) to the `deadlines.notifier` log."""
    if level not in LOG_LEVELS:
        raise NotifierError(f"notifier:log: level must be one of {', '.join(LOG_LEVELS)}, not {level!r}", permanent=True)
    log.log(LOG_LEVELS[level], "%s%s %s", headline(context), f": {message}" if message else "", json.dumps(dict(context), sort_keys=True))


def email_notifier(
    context: Mapping[str, Any], *, timeout: float, to: str | list[str] | None = None, subject: str = "", from_email: str = ""
) -> None:
    """Send the headline and the context with Django's send_mail to `to` (one address or a list)."""
    recipients = [to] if isinstance(to, str) else list(to or [])
    if not recipients or not all(isinstance(r, str) and "@" in r for r in recipients):
        raise NotifierError(f"notifier:email needs callback_kwargs.to (an address or a list of them), not {to!r}", permanent=True)
    body = headline(context) + "\n\n" + "\n".join(f"{key}: {value}" for key, value in sorted(context.items()))
    # The mail server gets the callback's bound too, so a stuck SMTP session cannot outlive it.
    connection = get_connection(timeout=timeout)
    send_mail(subject or headline(context), body, from_email or settings.DEFAULT_FROM_EMAIL, recipients, connection=connection)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect could lead to a host nobody allowed: treat it as the answer instead."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def allowed_host(url: str) -> str:
    """The host of an http(s) URL listed in ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS; else NotifierError."""
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise NotifierError("notifier:webhook needs callback_kwargs.url, an http(s) URL", permanent=True)
    allowed = {str(host).lower() for host in getattr(settings, "ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS", [])}
    if parts.hostname.lower() not in allowed:
        raise NotifierError(f"webhook host {parts.hostname!r} is not in ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS", permanent=True)
    return parts.hostname


def webhook_notifier(
    context: Mapping[str, Any], *, timeout: float, url: str = "", headers: Mapping[str, str] | None = None
) -> None:
    """POST the context as JSON to `url`, whose host must be allowed now (not only at import).

    Errors name the host, never the URL: webhook URLs often carry their secret in the path.
    """
    host = allowed_host(url)
    body = json.dumps({"event": context.get("event"), **context}, default=str).encode()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "orchestrator-deadlines", **dict(headers or {})},
    )
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        permanent = 400 <= exc.code < 500 and exc.code not in TRANSIENT_HTTP
        raise NotifierError(f"webhook {host} answered HTTP {exc.code}", permanent=permanent) from None
    except urllib.error.URLError as exc:
        raise NotifierError(f"webhook {host} unreachable: {exc.reason}") from None
    except TimeoutError:
        raise NotifierError(f"webhook {host} did not answer within {timeout:g}s") from None
    if not 200 <= status < 300:
        raise NotifierError(f"webhook {host} answered HTTP {status}")


NOTIFIERS: dict[str, Notifier] = {"log": log_notifier, "email": email_notifier, "webhook": webhook_notifier}


def get(callback: str) -> Notifier:
    """The notifier named by `notifier:NAME`."""
    name = callback[len(PREFIX) :] if callback.startswith(PREFIX) else callback
    try:
        return NOTIFIERS[name]
    except KeyError:
        raise NotifierError(f"unknown notifier {name!r} (use one of {', '.join(NOTIFIERS)})", permanent=True) from None


def call(callback: str, context: Mapping[str, Any], kwargs: Mapping[str, Any], *, timeout: float) -> None:
    """Run a notifier; an unknown keyword is a permanent error naming it."""
    notifier = get(callback)
    accepted = set(inspect.signature(notifier).parameters) - {"context", "timeout"}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise NotifierError(
            f"{callback}: unknown callback_kwargs {', '.join(unknown)} (accepted: {', '.join(sorted(accepted))})",
            permanent=True,
        )
    notifier(context, timeout=timeout, **kwargs)
