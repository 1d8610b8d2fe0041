"""Importing a 10,000-task DAG (layers of fan-out and fan-in) on SQLite, as `make run` does.

    .venv/bin/python -m bench.import_big [--tasks 10000] [--width 1000]

Prints the wall time of the first import and of an unchanged re-import, each split into reading
and validating the file (no lock held) and the write transaction (on SQLite, the time the write
lock is held: IMMEDIATE transactions take it at BEGIN). Uses a throwaway SQLite file. The load
average is printed with the figures: on a shared machine they are only as good as it was quiet.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import yaml

from bench.big_dag import big_dag


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--width", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-import-") as tmp:
        os.environ["DATABASE_URL"] = f"sqlite:///{tmp}/db.sqlite3"
        os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")  # settings need one; nothing is written
        os.environ["LOG_LEVEL"] = "WARNING"
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import transaction

        from orchestrator.specs.importer import load_specs, write_dag

        call_command("migrate", verbosity=0)
        spec_file = Path(tmp) / "big.yaml"
        spec_file.write_text(yaml.safe_dump(big_dag("big", args.tasks, args.width), sort_keys=False))
        print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")
        for label in ("first import", "unchanged re-import"):
            started = time.perf_counter()
            specs = load_specs([spec_file])
            validated = time.perf_counter()
            with transaction.atomic():
                outcomes = [write_dag(spec) for spec in specs]
            written = time.perf_counter()
            print(
                f"{label}: {written - started:.2f} s ({validated - started:.2f} s reading and validating,"
                f" {written - validated:.2f} s in the write transaction) -> {outcomes}"
            )
        print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")


if __name__ == "__main__":
    main()
