"""Tasks for the substitution tests: an upstream whose result is whatever the test chose."""
from __future__ import annotations

from typing import Any


def given(value: Any) -> Any:
    """Its result is `value` (from its op_kwargs): a hostile upstream result, a hostile list to map over."""
    return value
