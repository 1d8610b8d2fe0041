"""What a task process pays to import its task's module, in a process prepared as the fork server
prepares itself (its preloads, the code cache's loader, `gc.freeze`):

    python -m bench.task_import [--forks N] [--rounds R]

Each fork's child resolves `bench.tasks.noop` as a task process does and exits; the parent
waits. Three kinds of child, in alternating rounds so that a busy neighbour weighs on each alike:

  * `libc fork, exit`: forked and ended through libc, no Python in the child (the kernel's part);
  * `exit`: resolves nothing (a fork, Python's after-fork work and the exit);
  * `compiled in the task`: the module's source is compiled by the child, as every task process
    did where no `.pyc` could be written (PYTHONDONTWRITEBYTECODE, a task user that may not
    write the DAG folder);
  * `compiled ahead`: the fork server compiled it (`forkserver/codecache.py`).

Printed per fork: the child's CPU (user + system, from the parent's rusage of its children)
and its minor page faults, medians over the rounds.
"""
from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys

CALLABLE = "bench.tasks.noop"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forks", type=int, default=200, help="forks of each kind per round (default 200)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the medians count (default 5)")
    args = parser.parse_args(argv)
    sys.dont_write_bytecode = True
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
    os.environ.setdefault("SECRET_KEY", "bench-only")
    from orchestrator.foundation import memtrim
    from orchestrator.worker.forkserver import codecache
    from orchestrator.worker.forkserver.server import preload

    codecache.install()
    preload([])
    from orchestrator.worker.task.runner import import_callable

    if any(name == "bench.tasks" for name in sys.modules):
        raise SystemExit("bench.tasks is already imported here: nothing to measure")
    memtrim.trim()
    gc.freeze()

    import ctypes

    libc = ctypes.CDLL(None)
    raw_fork, raw_exit = libc.fork, libc._exit  # bound once: the child runs as little Python as can be

    def fork_many(import_it: bool, raw: bool = False) -> tuple[float, float]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        for _ in range(args.forks):
            if raw:
                pid = raw_fork()
                if pid == 0:
                    raw_exit(0)
                os.waitpid(pid, 0)
                continue
            pid = os.fork()
            if pid == 0:
                if import_it:
                    import_callable(CALLABLE)
                os._exit(0)
            os.waitpid(pid, 0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        return cpu / args.forks * 1000, (after.ru_minflt - before.ru_minflt) / args.forks

    import importlib.util

    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tasks.py")
    # Where a .pyc is there to read, the task reads it instead of compiling: say which was measured.
    own = "read from its .pyc" if os.path.exists(importlib.util.cache_from_source(source)) else "compiled in the task"
    kinds: dict[str, list[tuple[float, float]]] = {"libc fork, exit": [], "exit": [], own: [], "compiled ahead": []}
    for _ in range(args.rounds):
        kinds["libc fork, exit"].append(fork_many(False, raw=True))
        kinds["exit"].append(fork_many(False))
        kinds[own].append(fork_many(True))
        codecache.learn(CALLABLE)
        kinds["compiled ahead"].append(fork_many(True))
        codecache.clear()  # for the next round's "compiled in the task"
    print(f"  a task process importing {CALLABLE}, {args.forks} forks x {args.rounds} rounds (medians):")
    for kind, rows in kinds.items():
        cpu = statistics.median(row[0] for row in rows)
        faults = statistics.median(row[1] for row in rows)
        print(f"    {kind:<22} child CPU {cpu:5.2f} ms, {faults:4.0f} page faults")


if __name__ == "__main__":
    main()
