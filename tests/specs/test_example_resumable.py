"""The resumable example: its DAG imports, its job runs against the example job service, and
its batch load resumes from its checkpoint."""
from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from examples.jobservice import serve
from examples.resumable import ExportJob, load_in_batches
from orchestrator.foundation.task_state import MemoryTaskState
from orchestrator.local.stack import LocalStack
from orchestrator.models import Dag
from orchestrator.resumable import JOB_ID_KEY


@pytest.fixture
def service():
    server, book = serve("127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.server_port}", book
    server.shutdown()
    server.server_close()


@pytest.mark.django_db
def test_it_imports_the_resumable_dag() -> None:
    call_command("import_dags", "dags/example_resumable.yaml", stdout=StringIO())
    tasks = {t.task_id: t for t in Dag.objects.get(dag_id="example_resumable").tasks.all()}
    assert tasks["export"].python_callable == "examples.resumable.ExportJob"
    assert tasks["load"].upstream == ["export"]


def test_the_export_submits_once_and_a_second_attempt_finds_the_same_job(service) -> None:
    url, book = service
    state = MemoryTaskState()
    first = ExportJob(seconds=0.3, poll_interval=0.05, service_url=url).execute({"task_state": state, "idempotency_key": "k1"})
    assert first["rows"] == 1000
    assert state.decisions == ["submitted"]
    again = MemoryTaskState(dict(state.items()))
    assert ExportJob(service_url=url).execute({"task_state": again, "idempotency_key": "k1"}) == first
    assert again.decisions == ["already_succeeded"]
    assert len([e for e in book.events if e["event"] == "submit"]) == 1


def test_a_job_lost_between_submit_and_checkpoint_is_found_by_its_key(service) -> None:
    url, book = service
    job = book.submit("k2", 0.3, 0)  # submitted, but the id never reached the task state
    state = MemoryTaskState()
    ExportJob(poll_interval=0.05, service_url=url).execute({"task_state": state, "idempotency_key": "k2"})
    assert state.get(JOB_ID_KEY) == job.id
    assert state.decisions == ["reattached"]
    assert [e["new"] for e in book.events if e["event"] == "submit"] == [True]


def test_the_load_resumes_after_its_last_checkpoint(capsys) -> None:
    state = MemoryTaskState({"batches_done": 3})
    assert load_in_batches({"task_state": state, "idempotency_key": "k"}, batches=5) == 5
    out = capsys.readouterr().out
    assert "batch 2" not in out
    assert "batch 3" in out
    assert "batch 4" in out
    assert state.get("batches_done") == 5


def test_make_run_serves_the_job_service_to_its_workers(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("EXAMPLE_JOB_SERVICE_URL", raising=False)
    runner = LocalStack(state_dir=tmp_path, stream=StringIO())
    runner.env = {}
    runner._open_job_service()
    try:
        assert runner.env["EXAMPLE_JOB_SERVICE_URL"].startswith("http://127.0.0.1:")
    finally:
        runner.job_service.server_close()
