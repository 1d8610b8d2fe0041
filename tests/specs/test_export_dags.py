"""`manage.py export_dags`: the import format back, so that export -> import changes nothing."""
from __future__ import annotations

from io import StringIO

import pytest
import yaml
from django.core.management import CommandError, call_command

from orchestrator.models import Dag
from orchestrator.specs.exporter import dag_spec
from tests.specs.conftest import snapshot

pytestmark = pytest.mark.django_db

DAGS_FOLDER = "dags"


def run(command: str, *args: str) -> str:
    out = StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


def test_it_round_trips_exactly(baseline, spec_file) -> None:
    """import, export, import the export: the DB is unchanged and a second export is byte-identical."""
    run("import_dags", str(spec_file(baseline)), DAGS_FOLDER)
    before = snapshot()
    exported = run("export_dags")

    output = run("import_dags", str(spec_file(exported, "exported.yaml")))
    assert "0 created, 0 updated" in output
    assert snapshot() == before
    assert run("export_dags") == exported


def test_it_writes_what_was_imported(baseline, spec_file) -> None:
    """The export of an imported spec reads back as that spec (datetimes with the DAG's offset)."""
    run("import_dags", str(spec_file({**baseline, "paused": False})))
    [exported] = yaml.safe_load(run("export_dags", "settlement"))
    expected = {**baseline, "paused": False, "start_date": "2026-01-01T00:00:00+01:00"}
    assert exported == expected


def test_it_leaves_out_keys_that_were_not_set(spec_file) -> None:
    """A minimal DAG exports minimal: no invented default_args, deadlines or trigger rules."""
    minimal = {"dag_id": "tiny", "tasks": [{"task_id": "a", "bash_command": "true"}]}
    run("import_dags", str(spec_file(minimal)))
    assert run("export_dags", "tiny") == (
        "- dag_id: tiny\n"
        "  schedule: null\n"
        "  catchup: false\n"
        "  paused: false\n"
        "  max_active_runs: 16\n"
        "  tasks:\n"
        "  - task_id: a\n"
        "    bash_command: 'true'\n"
    )


def test_a_dag_read_plainly_exports_its_own_deadlines(baseline, spec_file) -> None:
    """dag_spec needs no prefetching: the DAG's deadlines are its own, its tasks' stay with them."""
    run("import_dags", str(spec_file(baseline)), DAGS_FOLDER)
    spec = dag_spec(Dag.objects.get(dag_id="settlement"))
    assert spec["deadlines"] == baseline["deadlines"]
    assert spec["tasks"][0]["deadlines"] == baseline["tasks"][0]["deadlines"]


def test_it_exports_the_dags_asked_for_in_that_order(spec_file) -> None:
    """DAG_ID arguments choose and order the DAGs; no arguments exports all, by dag_id."""
    run("import_dags", str(spec_file([{"dag_id": name} for name in ("b", "a", "c")])))
    ids = lambda text: [dag["dag_id"] for dag in yaml.safe_load(text)]  # noqa: E731
    assert ids(run("export_dags", "c", "a")) == ["c", "a"]
    assert ids(run("export_dags")) == ["a", "b", "c"]


def test_it_rejects_an_unknown_dag_id() -> None:
    """An unknown DAG_ID is an error naming it."""
    Dag.objects.create(dag_id="known")
    with pytest.raises(CommandError, match="unknown DAG: 'missing'"):
        run("export_dags", "known", "missing")


def test_it_exits_1_for_an_unknown_dag_id(spawn) -> None:
    """Run as a process, an unknown DAG_ID exits 1."""
    proc = spawn("export_dags", "missing")
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "unknown DAG: 'missing'" in output
