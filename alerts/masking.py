"""The one rule for what of a rule's `notify_kwargs` may be shown back: pages, the API, exports
without --include-secrets and logs all go through `mask()`.

A value looks secret when its key is named like a credential (token, password, secret, key,
url, ...), at any depth; a URL's path and query are secret whatever its key (a webhook URL often
carries its token in the path). A masked URL keeps its scheme and host, so an operator still
sees where it goes; any other masked value becomes MASK. Importing a masked value back keeps the
stored one (`unmask`).
"""
from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

MASK = "****"
SECRET_NAME = re.compile(r"token|password|passwd|secret|key|url|auth|credential|signature", re.IGNORECASE)


class MaskedWithoutValue(ValueError):
    """A masked value stands where there is no stored value to keep: the path names it."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def _masked_url(value: str) -> str | None:
    """The URL with its user, path and query hidden; None when `value` is no http(s) URL."""
    try:
        parts = urlsplit(value.strip())
        host, port = parts.hostname, parts.port
    except (ValueError, AttributeError):
        return None
    if parts.scheme.lower() not in ("http", "https") or not host:
        return None
    shown = f"{parts.scheme}://{host}" + (f":{port}" if port else "")
    hidden = parts.username or parts.password or parts.path.strip("/") or parts.query or parts.fragment
    return f"{shown}/{MASK}" if hidden else shown


def mask_value(key: str, value: Any) -> Any:
    """`value` as it may be shown under `key`."""
    if isinstance(value, dict):
        return {str(k): mask_value(str(k), v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_value(key, v) for v in value]
    if isinstance(value, str):
        url = _masked_url(value)
        if url is not None:
            return url
        if SECRET_NAME.search(key) and value:
            return MASK
        return value
    if SECRET_NAME.search(key) and value is not None and not isinstance(value, bool):
        return MASK
    return value


def mask(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """A rule's notify_kwargs as they may be shown: every secret-looking value masked."""
    return {str(k): mask_value(str(k), v) for k, v in (kwargs or {}).items()}


def is_masked(value: Any) -> bool:
    return isinstance(value, str) and MASK in value


def unmask(given: Any, stored: Any, path: str = "notify_kwargs") -> Any:
    """`given` with each masked value that is the mask of the stored value at the same place
    replaced by the stored value; MaskedWithoutValue when a masked value has none to keep."""
    if isinstance(given, dict):
        before = stored if isinstance(stored, dict) else {}
        return {k: unmask(v, before.get(k), f"{path}.{k}") for k, v in given.items()}
    if isinstance(given, list):
        before_list = stored if isinstance(stored, list) else []
        return [unmask(v, before_list[i] if i < len(before_list) else None, f"{path}[{i}]") for i, v in enumerate(given)]
    if is_masked(given):
        key = path.rsplit(".", 1)[-1].split("[", 1)[0]
        if stored is not None and mask_value(key, stored) == given:
            return stored
        raise MaskedWithoutValue(path)
    return given
