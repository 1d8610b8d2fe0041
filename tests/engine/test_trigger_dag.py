"""trigger_dag and run_status on the command line."""
from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from orchestrator.models import DagRun
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_rejects_an_unknown_dag(spawn):
    """Exit 1 and a message naming the DAG."""
    proc = spawn("trigger_dag", "nope")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "unknown DAG 'nope'" in out


def test_a_paused_dags_run_waits_queued():
    """As in Airflow: the run is created, and starts once the DAG is unpaused."""
    DagFactory(dag_id="sleepy", paused=True)
    call_command("trigger_dag", "sleepy")
    assert DagRun.objects.get().state == "queued"


@pytest.mark.parametrize("conf", ["[1, 2]", "{not json", '"text"'])
def test_it_rejects_conf_that_is_not_a_json_object(conf):
    """--conf must be a JSON object."""
    DagFactory(dag_id="d")
    with pytest.raises(CommandError, match="conf"):
        call_command("trigger_dag", "d", "--conf", conf)
    assert not DagRun.objects.exists()


@pytest.mark.parametrize("conf", ['{"a": "x\\u0000y"}', '{"a": ["ok", "\\udcff"]}', '{"\\u0000": 1}'])
def test_it_rejects_conf_holding_what_no_database_stores(conf):
    """NUL or a lone surrogate in --conf: a clear error naming where, and no run."""
    DagFactory(dag_id="d")
    with pytest.raises(CommandError, match="conf.*NUL character or a lone surrogate"):
        call_command("trigger_dag", "d", "--conf", conf)
    assert not DagRun.objects.exists()


def test_it_prints_the_run_id_and_status_json(capsys):
    """The run_id is the first stdout line; run_status --json prints the run document."""
    dag = DagFactory(dag_id="d")
    TaskFactory(dag=dag, task_id="t")
    call_command("trigger_dag", "d", "--conf", '{"day": "2026-01-01"}')
    run_id = capsys.readouterr().out.splitlines()[0]
    run = DagRun.objects.get(run_id=run_id)
    assert run.conf == {"day": "2026-01-01"}
    assert run_id.startswith("manual__")
    call_command("run_status", "d", run_id, "--json")
    doc = json.loads(capsys.readouterr().out)
    assert doc["dag_id"] == "d"
    assert doc["run_id"] == run_id
    assert doc["state"] == "running"
    (ti,) = doc["task_instances"]
    assert ti["task_id"] == "t"
    assert ti["state"] == "queued"
    assert ti["try_number"] == 1
    assert ti["max_tries"] == 1
    assert ti["infrastructure_try_number"] == 0
    assert ti["last_failure_context"] is None
    assert ti["attempts"][0]["kind"] == "user"
    assert ti["attempts"][0]["start_date"] is None
    assert doc["deadlines"] == []


def test_it_times_out_with_exit_code_2(spawn):
    """--wait --timeout with no worker: prints the run_id, then exits 2."""
    dag = DagFactory(dag_id="slow")
    TaskFactory(dag=dag, task_id="t")
    proc = spawn("trigger_dag", "slow", "--wait", "--timeout", "0.5")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    assert out.splitlines()[0].startswith("manual__")
