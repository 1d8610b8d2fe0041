"""Django's apps loaded on demand in a process that never called django.setup() (a task process).

Each case runs in a fresh interpreter: this test process has its apps loaded already. Warnings
are errors there, so a models module imported twice (its models registered twice) fails.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
from django.apps import apps
from orchestrator.worker.forkserver import lazyapps
lazyapps.on_demand()
import orchestrator.worker.task.runner, orchestrator.worker.failpoints  # what the fork server preloads
assert not apps.ready, "the task runner alone must not load the apps"
"""


def run(body: str) -> str:
    code = PRELUDE + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # a model imported inside a function, called late
        ("def task():\n    from orchestrator.models import Dag\n    return Dag._meta.label\nprint(task())", "orchestrator.Dag"),
        # a contrib app's models, and a second app's after the first loaded everything
        ("from django.contrib.auth.models import User\nfrom deadlines.models import Deadline\nprint(User._meta.label, Deadline._meta.label)",
         "auth.User deadlines.Deadline"),
        # the registry asked directly, no models import at all
        ("from django.contrib.auth import get_user_model\nprint(get_user_model()._meta.label)", "auth.User"),
        ("print(apps.get_model('orchestrator', 'TaskInstance')._meta.label)", "orchestrator.TaskInstance"),
    ],
)
def test_the_apps_load_when_a_task_first_needs_them(body, expected):
    assert run(body) == expected


def test_a_models_module_is_imported_once_and_keeps_its_own_spec():
    out = run(
        """
        import orchestrator.models as first
        from orchestrator import models as second
        assert first is second is sys.modules["orchestrator.models"]
        print(type(first.__spec__.loader).__name__, apps.ready)
        """
    )
    assert out == "SourceFileLoader True"


def test_nothing_is_loaded_for_a_task_that_does_not_use_them():
    assert run("import json, bench.tasks\nbench.tasks.noop()\nprint(apps.ready)") == "False"
