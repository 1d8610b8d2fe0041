"""Importable objects for spec validation tests."""
from __future__ import annotations

from typing import Any

NOT_CALLABLE = 42


def page(**kwargs: Any) -> None:
    """A deadline callback."""


class CopyOperator:
    """A class-based task: instantiated with op_kwargs, then execute(context)."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def execute(self, context: dict[str, Any]) -> None:
        pass


class NotAnOperator:
    """A class without execute(): not a task."""
