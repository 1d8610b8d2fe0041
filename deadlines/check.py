"""The periodic deadline check."""
from __future__ import annotations

from datetime import datetime


def check_due(now: datetime, limit: int = 500) -> int:
    """Mark due deadlines missed (exactly once) and queue their callbacks; return how many."""
    return 0
