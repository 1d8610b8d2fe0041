"""The fresh copy of the repository the tests of a user's first minutes run in."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.local.stack import fresh_copy


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository as a fresh clone has it, one per test module."""
    return fresh_copy(tmp_path_factory.mktemp("clone") / "orchestrator")
