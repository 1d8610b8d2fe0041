"""Landlock confinement of an attempt: a confined process signals and traces only its own."""
from __future__ import annotations

import errno
import json
import os
import signal
import time

import pytest

from orchestrator.worker.forkserver import confinement

pytestmark = pytest.mark.skipif(not confinement.available(), reason="no Landlock with signal scoping (Linux 6.12)")


def _in_a_confined_child(outside: int) -> dict[str, str]:
    """Fork; the child confines itself, then signals `outside` and a child of its own."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        found = {}
        try:
            confinement.confine()
            grandchild = os.fork()
            if grandchild == 0:
                time.sleep(30)
                os._exit(0)
            for name, target in (("outside", outside), ("own child", grandchild)):
                try:
                    os.kill(target, 0)
                    found[name] = "ok"
                except OSError as exc:
                    found[name] = errno.errorcode[exc.errno or 0]
            os.kill(grandchild, signal.SIGKILL)
        except BaseException as exc:  # reported, never raised in a forked test process
            found["error"] = repr(exc)
        os.write(write_end, json.dumps(found).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as answer:
        found = json.loads(answer.read())
    os.waitpid(pid, 0)
    return found


def test_a_confined_process_signals_its_own_children_and_nothing_outside():
    sleeper = os.fork()
    if sleeper == 0:
        time.sleep(30)
        os._exit(0)
    try:
        # Root may signal anything, but not from inside a domain: Landlock is not a capability.
        assert _in_a_confined_child(sleeper) == {"outside": "EPERM", "own child": "ok"}
        os.kill(sleeper, 0)  # this unconfined process still may
    finally:
        os.kill(sleeper, signal.SIGKILL)
        os.waitpid(sleeper, 0)


def test_the_kernel_reports_a_landlock_abi():
    assert confinement.abi() >= confinement.SIGNAL_SCOPE_ABI


def test_it_works_here_tried_in_a_throwaway_child():
    assert confinement.works()
    os.kill(os.getppid(), 0)  # this process was not confined by the try: it still reaches outside itself
