"""A generated DAG of layers of fan-out and fan-in, written as a spec file (YAML).

    python -m bench.big_dag OUT.yaml [--tasks 10000] [--width 1000]

`--tasks` no-op python tasks in blocks: a hub, then `--width - 1` tasks each downstream of the
hub (fan-out); the next block's hub is downstream of all of them (fan-in).
"""
from __future__ import annotations

import argparse

import yaml


def big_dag(dag_id: str, tasks: int, width: int) -> dict:
    specs: list[dict] = []
    previous: list[str] = []
    while len(specs) < tasks:
        hub = f"hub_{len(specs)}"
        specs.append({"task_id": hub, "python_callable": "bench.tasks.noop", "upstream": previous})
        layer = [f"t_{len(specs) + i}" for i in range(min(width - 1, tasks - len(specs)))]
        specs.extend({"task_id": name, "python_callable": "bench.tasks.noop", "upstream": [hub]} for name in layer)
        previous = layer or [hub]
    return {"dag_id": dag_id, "schedule": None, "default_args": {"retries": 0}, "tasks": specs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--width", type=int, default=1000)
    parser.add_argument("--dag-id", default="big")
    args = parser.parse_args()
    with open(args.out, "w") as f:
        yaml.safe_dump(big_dag(args.dag_id, args.tasks, args.width), f, sort_keys=False)


if __name__ == "__main__":
    main()
