"""The database's clock: heartbeats and leases are compared against it, never a worker's own clock."""
from __future__ import annotations

from datetime import datetime

from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

__all__ = ["Now", "db_now"]


def db_now() -> datetime:
    """The current time as the metadata database sees it."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT CURRENT_TIMESTAMP")
            return cursor.fetchone()[0]
    # SQLite runs in this process on this machine: its clock is ours.
    return timezone.now()
