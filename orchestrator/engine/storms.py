"""Infrastructure storms: which queues are paused because their machines keep failing.

Filled in by the storm rules; until a queue is paused nothing is held for it.
"""
from __future__ import annotations

from datetime import datetime


def paused_queues(now: datetime) -> set[str]:
    return set()
