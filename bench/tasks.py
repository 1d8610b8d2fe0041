"""The tasks and RQ jobs the benchmarks run. Importing this module imports neither Django nor
anything of the project, so a task process pays nothing for it."""
from __future__ import annotations

import subprocess
import sys
import time


def noop() -> None:
    """A python task that does nothing: what is measured is the engine."""
    return


def stamp(path: str) -> None:
    """A no-op python task that appends the time its code started and ended to `path`: the chain
    as the tasks see it (one line per task, in the order they ran)."""
    entered = time.time()
    left = time.time()
    with open(path, "a") as out:
        out.write(f"{entered!r} {left!r}\n")


def sleep(seconds: float) -> None:
    """A python task that holds its slot (and its process) for `seconds`."""
    time.sleep(seconds)


def spawn_python_pass() -> int:
    """The raw RQ job of the floor: start `python -c pass` and wait for it, as a supervisor
    would start a task process if it had no fork server."""
    return subprocess.run([sys.executable, "-c", "pass"], check=True).returncode


def spawn_python_pass_then(next_ids: list[str]) -> int:
    """The raw RQ floor's chained step: `python -c pass`, then enqueue the next step (the first of
    `next_ids`, under that job id) on this job's queue, as a chain of plain RQ jobs hands over."""
    code = spawn_python_pass()
    if next_ids:
        from rq import Queue, get_current_job

        job = get_current_job()
        assert job is not None
        Queue(job.origin, connection=job.connection).enqueue(spawn_python_pass_then, next_ids[1:], job_id=next_ids[0], result_ttl=600)
    return code


def items(count: int) -> list[int]:
    """A list result for a mapped task to expand over."""
    return list(range(count))


def noop_item(item: object) -> None:
    """A mapped instance that does nothing with its item."""
    return


def fail() -> None:
    """A python task that fails the same way every time (an application failure, one cause)."""
    raise KeyError("customer_id")
