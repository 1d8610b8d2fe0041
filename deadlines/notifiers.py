"""Built-in notifiers: `notifier:log`, `notifier:email`, `notifier:webhook`.

Each takes the callback context (see deadlines.callbacks.build_context) and the deadline's
callback_kwargs. A problem the next attempt cannot fix (a host not allowed, no recipients)
raises NotifierError with `permanent=True`, so the callback is not retried for it; a webhook's
answer other than 2xx is a failed try, tried again.
"""
from __future__ import annotations

import http.client
import inspect
import ipaddress
import json
import logging
import socket
import ssl
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.mail import get_connection, send_mail

log = logging.getLogger("deadlines.notifier")

PREFIX = "notifier:"
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class NotifierError(Exception):
    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


Notifier = Callable[..., None]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


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


# --- webhook: only to allowed hosts, never inside the network unless an address is listed -------


def _allowed_entries() -> set[str]:
    return {str(host).strip().strip("[]").lower() for host in getattr(settings, "ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS", [])}


def allowed_host(url: str) -> str:
    """The host of an http(s) URL listed in ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS; else NotifierError.

    This is the check a DAG import can make without DNS; `webhook_notifier` also checks the
    addresses the host resolves to when it sends.
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except (TypeError, AttributeError, ValueError):
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise NotifierError("notifier:webhook needs callback_kwargs.url, an http(s) URL", permanent=True)
    if parts.hostname.lower() not in _allowed_entries():
        raise NotifierError(f"webhook host {parts.hostname!r} is not in ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS", permanent=True)
    return parts.hostname


def is_internal(address: IPAddress) -> bool:
    """Loopback, link-local (cloud metadata at 169.254.169.254), private, unspecified, reserved,
    multicast, or anything else not globally routable; an IPv4-mapped IPv6 address as its IPv4."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (
        address.is_loopback
        or address.is_link_local
        or address.is_private
        or address.is_unspecified
        or address.is_reserved
        or address.is_multicast
        or not address.is_global
    )


def safe_addresses(host: str, port: int) -> list[IPAddress]:
    """The addresses `host` resolves to, all of them checked; NotifierError if any is internal
    and not itself in ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS (naming a host is not enough)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise NotifierError(f"webhook {host} could not be resolved: {exc.strerror}") from None
    # An IP address is a string; the (int, bytes) form of a Python built without IPv6 is never
    # connected to either, since only the addresses checked here are.
    resolved = [info[4][0] for info in infos]
    addresses = list(dict.fromkeys(ipaddress.ip_address(ip.split("%")[0]) for ip in resolved if isinstance(ip, str)))
    listed = _allowed_entries()
    for address in addresses:
        if is_internal(address) and str(address) not in listed:
            raise NotifierError(
                f"webhook {host} resolves to the internal address {address}, which is not itself in "
                "ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS",
                permanent=True,
            )
    return addresses


class _PinnedHTTP(http.client.HTTPConnection):
    """Connects to the address that was checked, whatever DNS says by now; Host is the name."""

    def __init__(self, host: str, port: int, address: IPAddress, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def _open(self) -> socket.socket:
        return socket.create_connection((str(self.address), self.port), self.timeout)

    def connect(self) -> None:
        self.sock = self._open()


class _PinnedHTTPS(_PinnedHTTP):
    """TLS to the checked address, with SNI and certificate verification for the host name."""

    default_port = http.client.HTTPS_PORT

    def connect(self) -> None:
        self.sock = ssl.create_default_context().wrap_socket(self._open(), server_hostname=self.host)


def _post(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> int:
    """POST to the first reachable checked address of the URL's host; the response status.

    Redirects are not followed (http.client never does): the caller sees the 3xx.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    connection_class = _PinnedHTTPS if parts.scheme == "https" else _PinnedHTTP
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    last_error: OSError | None = None
    for address in safe_addresses(host, port):
        connection = connection_class(host, port, address, timeout)
        try:
            connection.request("POST", target, body=body, headers=dict(headers))
            return connection.getresponse().status
        except (ConnectionError, socket.gaierror) as exc:  # refused or reset: try the next address
            last_error = exc
        finally:
            connection.close()
    raise NotifierError(f"webhook {host} unreachable: {last_error}")


def webhook_notifier(
    context: Mapping[str, Any], *, timeout: float, url: str = "", headers: Mapping[str, str] | None = None
) -> None:
    """POST the context as JSON to `url`, whose host must be allowed now (not only at import).

    Errors name the host, never the URL: webhook URLs often carry their secret in the path.
    """
    host = allowed_host(url)
    body = json.dumps({"event": context.get("event"), **context}, default=str).encode()
    sent = {"Content-Type": "application/json", "User-Agent": "orchestrator-deadlines", **dict(headers or {})}
    if context.get("idempotency_key"):
        sent["Idempotency-Key"] = str(context["idempotency_key"])  # the same on every re-delivery
    try:
        status = _post(url, body, sent, timeout)
    except TimeoutError:
        raise NotifierError(f"webhook {host} did not answer within {timeout:g}s") from None
    except ssl.SSLError as exc:
        raise NotifierError(f"webhook {host}: TLS failed: {exc.reason or exc}") from None
    except (OSError, http.client.HTTPException) as exc:
        raise NotifierError(f"webhook {host} unreachable: {exc}") from None
    # Any other answer is a failed try, tried again: a receiver that answers 404 or 403 while it
    # is being deployed or its token rotated turns around as often as one that answers 500.
    if 300 <= status < 400:
        raise NotifierError(f"webhook {host} answered HTTP {status}: redirects are not followed")
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
