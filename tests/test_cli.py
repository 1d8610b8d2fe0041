"""`orchestrator COMMAND` is `python manage.py COMMAND`: same output and exit codes."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

ORCHESTRATOR = Path(sys.executable).parent / "orchestrator"


def _both(process_env, *args: str) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    assert ORCHESTRATOR.exists(), f"{ORCHESTRATOR} is missing: `make install` installs it"
    run = lambda command: subprocess.run(command, env=process_env, cwd="/", capture_output=True, text=True, timeout=120)  # noqa: E731
    return run([str(ORCHESTRATOR), *args]), run([sys.executable, str(ROOT / "manage.py"), *args])


@pytest.mark.parametrize(
    "args",
    [
        ("list_pools",),
        ("trigger_dag", "no-such-dag"),
        ("set_pool", "cli-pool", "not-a-number"),
    ],
)
def test_orchestrator_runs_the_same_command_as_manage_py(process_env, args):
    ours, theirs = _both(process_env, *args)
    assert ours.returncode == theirs.returncode
    assert ours.stdout == theirs.stdout
    # The usage text wraps at the program's name; the error itself is the same.
    last = lambda text: text.strip().splitlines()[-1].replace("manage.py", "orchestrator") if text.strip() else ""  # noqa: E731
    assert last(ours.stderr) == last(theirs.stderr)


def test_its_help_names_it(process_env):
    ours, _ = _both(process_env, "help")
    assert "Type 'orchestrator help <subcommand>'" in ours.stdout
