"""Task callables for the params tests: they return what their context holds."""
from __future__ import annotations

from typing import Any


def echo_params(context: dict[str, Any]) -> dict[str, Any]:
    return {"params": context["params"], "conf": context["conf"]}
