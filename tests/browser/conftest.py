"""A real headless Chromium against pytest-django's live server."""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connections

from tests.api.personas import fast_password_hasher  # noqa: F401

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def browser_page(monkeypatch) -> Iterator:
    """A fresh page in headless Chromium; skipped where Chromium is not installed."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop; the test's own ORM calls are still synchronous.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(10_000)
            yield page
        finally:
            browser.close()


@contextmanager
def own_connections() -> Iterator[None]:
    """Close the database connections the test body opened while Playwright ran.

    Under Playwright's sync API the test body runs in a context of its own, so its ORM calls
    open connections that pytest-django does not know about; left open, they keep the test
    database from being dropped.
    """
    try:
        yield
    finally:
        connections.close_all()
