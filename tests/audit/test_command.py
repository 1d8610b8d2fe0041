"""orchestrator audit: the API's entries and filters, one line each or --json; a bad option is
an error naming it (exit 1)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from tests.audit.conftest import ACTIONS_OLDEST_FIRST
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db


def audit(capsys, *args: str) -> str:
    call_command("audit", *args)
    return capsys.readouterr().out


def test_it_prints_one_line_per_entry_newest_first(capsys, history):
    lines = audit(capsys).splitlines()
    assert [line.split(" ")[2] for line in lines] == ACTIONS_OLDEST_FIRST[::-1]
    assert lines[0].split(" ")[1:5] == ["alice", "mark_failed", f"mapped/{history.mapped.run_id}/load[1]", "queued->failed"]
    assert lines[0].endswith('note="bad item"')
    clear = next(line for line in lines if " clear " in line and f"/{history.run.run_id}/" in line)
    assert f" etl/{history.run.run_id}/load failed->none " in clear
    assert " circuit:payments-api closed->open " in next(line for line in lines if " circuit_open " in line)


def test_json_prints_the_api_entries_as_one_list(capsys, bob_client, history):
    printed = json.loads(audit(capsys, "--json"))
    assert printed == bob_client.get("/api/v1/audit").json()["entries"]


def test_the_options_filter_as_the_api_does(capsys, bob_client, history):
    run_id = history.run.run_id
    options = ["--dag", "etl", "--run", run_id, "--task", "load", "--action", "clear", "--user", "alice", "--since", "2000-01-01", "--limit", "5"]
    printed = json.loads(audit(capsys, *options, "--json"))
    query = {"dag_id": "etl", "run_id": run_id, "task_id": "load", "action": "clear", "user": "alice", "since": "2000-01-01", "limit": 5}
    assert printed == bob_client.get("/api/v1/audit", query).json()["entries"]
    assert [e["action"] for e in printed] == ["clear"]
    assert len(audit(capsys, "--limit", "2").splitlines()) == 2


@pytest.mark.parametrize(
    ("args", "named"),
    [(["--since", "soon"], "--since 'soon'"), (["--limit", "x"], "--limit 'x'"), (["--limit", "-3"], "--limit '-3'")],
)
def test_a_bad_option_is_an_error_naming_it(args, named):
    with pytest.raises(CommandError, match=named):
        call_command("audit", *args)


def test_the_console_script_runs_it_and_exits_1_on_a_bad_option(process_env):
    script = ROOT / ".venv" / "bin" / "orchestrator"
    command = [str(script)] if script.exists() else [sys.executable, str(ROOT / "manage.py")]
    done = subprocess.run([*command, "audit", "--since", "not-a-date"], env=process_env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "--since 'not-a-date'" in done.stderr
    done = subprocess.run([*command, "audit", "--json"], env=process_env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert json.loads(done.stdout) == []
