"""A report's JSON form (what the spool keeps) reads back as the same report, whatever its ending."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from orchestrator.worker.classify import Outcome, Verdict
from orchestrator.worker.host.report import Failure, Memory, Output, Report, Rescheduled, Success, refused, report_of
from orchestrator.worker.host.supervisor import Supervised
from retries.context import ExecutionContext
from retries.states import REPORT_SUCCESS_FROM, Reason, Source, TaskState

ENDED = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)
FAILED = Failure(
    ExecutionContext.of(Reason.TASK_EXCEPTION, Source.WORKER, worker_name="w", message="boom"),
    fingerprint="abc",
    retry_after=None,
    error="ValueError: boom",
    expected=(TaskState.RUNNING,),
)


@pytest.mark.parametrize("ending", [Success({"rows": [1, 2]}), Rescheduled(30.0), FAILED])
def test_a_report_reads_back_from_its_json_unchanged(ending):
    report = Report(1, 7, ENDED, Output("out", "err", True), ending, Memory(256, 100), ({"op": "set", "key": "k", "value": 1},))
    assert Report.from_json(json.loads(json.dumps(report.to_json()))) == report


def test_its_json_keeps_the_spools_keys():
    record = Report(1, 7, ENDED, Output(), FAILED).to_json()
    assert set(record) == {"task_instance_id", "token", "success", "ended_at", "output", "context", "fingerprint", "retry_after", "error", "expected"}
    assert record["success"] is False
    assert record["expected"] == ["running"]
    assert record["output"] == {"stdout": "", "stderr": "", "output_truncated": False}


def test_a_report_of_what_the_task_wrote_is_made_storable_and_says_so():
    supervised = Supervised(superseded=False, outcome=Outcome(), stdout="a\x00b", stderr="warn")
    report = report_of(1, 7, Verdict(True, result="x\x00"), supervised, ENDED)
    assert report.ending == Success("x\ufffd")
    assert report.output.stdout == "a\ufffdb"
    assert report.output.stderr.startswith("warn\n[orchestrator: unstorable characters")
    assert "in: result, output.stdout]" in report.output.stderr
    failure = report_of(1, 7, Verdict(False, context=FAILED.context, error="e\x00"), supervised, ENDED).ending
    assert isinstance(failure, Failure)
    assert failure.error == "e\ufffd"
    assert failure.context.metadata["sanitised"] == ["error", "output.stdout"]


def test_a_refused_success_becomes_a_bare_failure_of_the_same_attempt():
    bare = refused(Report(1, 7, ENDED, Output("out", "err"), Success(1), Memory(1, 1)), ValueError("no"))
    assert ((bare.task_instance_id, bare.token), bare.ended_at, bare.output, bare.memory) == ((1, 7), ENDED, Output("", "", True), None)
    assert isinstance(bare.ending, Failure)
    assert bare.ending.expected == tuple(REPORT_SUCCESS_FROM)
    assert bare.ending.context.metadata["exception_type"] == "UnstorableOutcome"
