"""What `trigger_dag --wait` shows while it waits: in place on a terminal, line by line in a pipe,
between the run_id (first line) and the final state (last line)."""
from __future__ import annotations

import io

from django.core.management.base import OutputWrapper

from orchestrator.management.commands.trigger_dag import Progress, ProgressDisplay


def _progress(**counts: int) -> Progress:
    values = dict(run_state="running", total=2, done=0, running=0, queued=0, failed=0, retrying=0, dead_letter=0)
    values.update(counts)
    return Progress(**values)


def test_progress_names_done_running_failed_and_the_run_state():
    assert _progress(done=1, running=1).text() == "tasks: 1/2 done, 1 running, 0 failed; run: running"
    assert _progress(retrying=1, queued=1).text() == "tasks: 0/2 done, 0 running, 0 failed, 1 queued, 1 waiting to retry; run: running"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_one_line_per_change_when_not_on_a_terminal():
    stream = io.StringIO()
    display = ProgressDisplay(OutputWrapper(stream))
    for text in ("a", "a", "b"):
        display.show(text)
    display.end()
    assert stream.getvalue() == "a\nb\n"


def test_progress_is_rewritten_in_place_on_a_terminal():
    stream = _Terminal()
    display = ProgressDisplay(OutputWrapper(stream))
    for text in ("first", "first", "second"):
        display.show(text)
    display.end()
    assert stream.getvalue() == "\rfirst\033[K\rsecond\033[K\n"
