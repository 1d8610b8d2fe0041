from __future__ import annotations

from collections.abc import Iterator

import pytest

from alerts import rules_cache
from tests.api.personas import (  # noqa: F401
    alice,
    alice_client,
    anonymous_client,
    bob,
    bob_client,
    fast_password_hasher,
)


@pytest.fixture(autouse=True)
def no_platform_retry_delay(settings) -> None:
    settings.ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY = 0


@pytest.fixture(autouse=True)
def fresh_rules() -> Iterator[None]:
    """Each test reads the rules it made (the cache is per process)."""
    rules_cache.invalidate()
    yield
    rules_cache.invalidate()
