"""Callables of the `example_mapping` DAG: list the day's files, load each one in its own task
instance, and summarise what was loaded.

Results carry small values only: file names, row counts. The files themselves stay where they
are; each instance is handed a path, not the data.
"""
from __future__ import annotations

from typing import Any


def list_files(prefix: str, count: int, context: dict[str, Any]) -> list[str]:
    """The day's files: known only at run time, so the next task is mapped over them."""
    day = context["logical_date"][:10]
    return [f"{prefix}/{day}/part-{i:03d}.csv" for i in range(count)]


def load_file(path: str, context: dict[str, Any]) -> dict[str, Any]:
    """One instance per file: `path` is this instance's item."""
    rows = 100 + 7 * context["map_index"]
    print(f"loaded {rows} rows from {path}")
    return {"path": path, "rows": rows}


def summarise(context: dict[str, Any]) -> dict[str, Any]:
    """The mapped upstream's results arrive as one list, in map_index order."""
    loaded = context["results"]["load_file"]
    return {"files": len(loaded), "rows": sum(item["rows"] for item in loaded)}
