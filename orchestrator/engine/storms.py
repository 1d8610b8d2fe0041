"""Queues paused by an infrastructure storm: the seam dispatch and /metrics read.

No storm rule is applied yet, so no queue is ever paused; dispatch already holds the tasks of
a paused queue (`waiting_for` kind "queue") and /metrics already reports paused queues.
"""
from __future__ import annotations

from datetime import datetime


def paused_queues(now: datetime) -> set[str]:
    return set()
