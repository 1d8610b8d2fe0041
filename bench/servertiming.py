"""A middleware of the benchmark's web server only (bench/web_settings.py): each answer carries
`Server-Timing: app;dur=MS, db;dur=MS, queries;dur=N`, the time the request took inside Django
(from the first middleware in to the response out), the part of it spent in SQL statements, and
their number. The client reads it; nothing else changes."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.db import connection
from django.http import HttpRequest, HttpResponse


class ServerTiming:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        spent = [0, 0.0]

        def timed(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
            began = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                spent[0] += 1
                spent[1] += time.perf_counter() - began

        began = time.perf_counter()
        with connection.execute_wrapper(timed):
            response = self.get_response(request)
        total = time.perf_counter() - began
        response["Server-Timing"] = f"app;dur={total * 1000:.2f}, db;dur={spent[1] * 1000:.2f}, queries;dur={spent[0]}"
        return response


def parse(header: str | None) -> dict[str, float]:
    """`app;dur=1.5, db;dur=0.4` -> {"app": 1.5, "db": 0.4}; what cannot be read is left out."""
    out: dict[str, float] = {}
    for part in (header or "").split(","):
        name, _, rest = part.strip().partition(";")
        key, _, value = rest.strip().partition("=")
        if name and key == "dur":
            try:
                out[name] = float(value)
            except ValueError:
                continue
    return out
