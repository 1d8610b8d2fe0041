"""Deadline callbacks used by the tests (imported by real worker processes too)."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def append_to_file(path: str, context: dict[str, Any], **kwargs: Any) -> None:
    """Append one JSON line per call: the context and the extra kwargs."""
    with Path(path).open("a") as out:
        out.write(json.dumps({"context": context, "kwargs": kwargs}) + "\n")


def explode(message: str = "pager service is down") -> None:
    raise RuntimeError(message)


def hang(seconds: float = 30) -> None:
    time.sleep(seconds)


def no_context(path: str) -> None:
    """A callback that takes no context still gets its kwargs."""
    Path(path).write_text("called")


def sleep_task(seconds: float = 1.0) -> None:
    """A task that takes a while."""
    time.sleep(seconds)


def read_calls(path: str | Path) -> list[dict[str, Any]]:
    file = Path(path)
    if not file.exists():
        return []
    return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
