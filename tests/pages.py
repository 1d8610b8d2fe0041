"""Fetching a console page in a test and counting the queries it costs."""
from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext


def get_counted(client, url: str) -> tuple[int, str]:
    """GET `url` (it must answer 200): the number of queries it ran and the page."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    return len(queries.captured_queries), response.content.decode()
