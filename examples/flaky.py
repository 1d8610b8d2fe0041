"""A task that fails on its first try and succeeds on the next, for the `example_flaky` DAG."""
from __future__ import annotations

from typing import Any


def fail_first_try(context: dict[str, Any]) -> str:
    """Raise on user try 1 (an application failure, spending one retry), succeed after."""
    if context["try_number"] == 1:
        raise RuntimeError("simulated failure: the upstream service was not ready on the first try")
    print(f"succeeded on try {context['try_number']}")
    return "ok"


def report(context: dict[str, Any]) -> None:
    print(f"flaky step done in run {context['run_id']}")
