"""What a task writes where its worker reads: its channel, and the worker's spool.

Anything on its channel that is no well-formed message fails the attempt as the task's own
`application/invalid_result`, never the platform's failure, never an error in the worker; and a
report it writes into the spool, for another task, is never delivered: set aside, counted,
logged as not made by this platform. Real workers, on both databases
(`TEST_DATABASE=sqlite bin/test tests/hostile/test_channel_and_spool.py`), and the seal and the
bounded decoder on their own.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from orchestrator.data import metrics
from orchestrator.engine import reporting
from orchestrator.engine.reporting import WorkerInfo
from orchestrator.foundation.results import MAX_DEPTH, check_result, deeper_than
from orchestrator.models import TaskInstance
from orchestrator.worker.channel import (
    MESSAGE_MARGIN_BYTES,
    MESSAGE_MAX_DEPTH,
    LineReader,
    MalformedMessage,
    decode_message,
    message_max_bytes,
    send,
)
from orchestrator.worker.classify import Outcome, classify, message_problem
from orchestrator.worker.final import InvalidResult, Succeeded
from orchestrator.worker.host.spool import NotOurs, Spool, seal, unsealed
from tests.conftest import wait_until
from tests.hostile.channel_tasks import LINES, return_nested
from tests.hostile.conftest import platform_names
from tests.worker.conftest import make_dag, queue_name, scheduler_settings, settle, trigger, worker  # noqa: F401  fixtures reused here

T = "tests.hostile.channel_tasks."


def nested(depth: int) -> object:
    return return_nested(depth)


# --- the seal -------------------------------------------------------------------------------


def report(ti: int = 1, token: int = 1) -> dict:
    return {"task_instance_id": ti, "token": token, "success": True, "ended_at": "2026-01-01T00:00:00+00:00",
            "output": {"stdout": "", "stderr": "", "output_truncated": False}, "result": {"iban": "NL00BANK"}}  # fmt: skip


def test_a_sealed_report_reads_back_as_it_was_and_is_still_json():
    text = seal(json.dumps(report()), secret="the worker's")
    assert unsealed(text, secrets=["the worker's"]) == report()
    assert json.loads(text)["result"] == {"iban": "NL00BANK"}  # still a JSON object, for whoever looks


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda text: text.replace("NL00BANK", "NL00BANL"), id="one byte of the record"),
        pytest.param(lambda text: text[:8] + ("1" if text[8] == "0" else "0") + text[9:], id="one digit of the seal"),
        pytest.param(lambda text: '{"mac":"' + "0" * 64 + '",' + json.dumps(report())[1:], id="a made-up seal"),
        pytest.param(lambda text: json.dumps(report()), id="no seal"),
        pytest.param(lambda text: '{"mac":"' + "é" * 64 + '",' + json.dumps(report())[1:], id="a seal that is not hex"),
        pytest.param(lambda text: "{not json", id="not json"),
        pytest.param(lambda text: "", id="empty"),
    ],
)
def test_a_tampered_report_is_not_ours(tamper):
    text = seal(json.dumps(report()), secret="the worker's")
    with pytest.raises(NotOurs):
        unsealed(tamper(text), secrets=["the worker's"])


def test_a_report_sealed_with_another_key_or_as_another_kind_is_not_ours():
    text = json.dumps(report())
    with pytest.raises(NotOurs):
        unsealed(seal(text, secret="a task's throwaway key"), secrets=["the worker's"])
    with pytest.raises(NotOurs):
        unsealed(seal(text, kind="task_state", secret="the worker's"), kind="report", secrets=["the worker's"])
    assert unsealed(seal(text, secret="the old key"), secrets=["the new key", "the old key"]) == report()  # a fallback


@pytest.mark.django_db
def test_the_spool_keeps_what_it_does_not_make_away_from_delivery(tmp_path, caplog):
    spool = Spool(tmp_path, "hostile.1", secret="the worker's")
    spool.put(report(1))
    (spool.directory / "ti-2-1.json").write_text(json.dumps(report(2)))
    (tmp_path / "ti-3-1.json").write_text(seal(json.dumps(report(3)), secret="another worker's"))
    os.mkfifo(spool.directory / "ti-4-1.json")  # never opened for reading: it would block
    delivered: list[int] = []
    refused_before = _refused_total()
    assert spool.drain(lambda r: delivered.append(r["task_instance_id"]) or True) == 1
    assert delivered == [1]
    aside = tmp_path / "set-aside"
    assert sorted(p.name for p in aside.glob("ti-*.json")) == ["ti-2-1.json", "ti-3-1.json", "ti-4-1.json"]
    assert all("not made by this platform" in Path(f"{p}.reason").read_text() for p in aside.glob("ti-*.json"))
    assert _refused_total() - refused_before == 3
    assert caplog.text.count("not made by this platform") == 3
    spool.close()


@pytest.mark.django_db
def test_a_forged_file_of_the_same_name_never_replaces_a_spooled_report(tmp_path):
    """Adopted from the root under the name of a report waiting in the worker's own directory,
    a forgery is moved in beside it, not over it: the report is delivered, the forgery refused."""
    spool = Spool(tmp_path, "hostile.1", secret="the worker's")
    spool.put(report(5))
    (tmp_path / "ti-5-1.json").write_text(json.dumps({**report(5), "result": {"iban": "ATTACKER"}}))
    delivered: list[dict] = []
    assert spool.drain(lambda r: delivered.append(r) or True) == 1
    assert [r["result"] for r in delivered] == [{"iban": "NL00BANK"}]
    assert [p.name for p in (tmp_path / "set-aside").glob("ti-*.json")] == ["ti-5-1.1.json"]
    spool.close()


def test_the_spool_is_the_workers_own(tmp_path):
    """Its directories 0700 (also those made before, open to all) and its files 0600."""
    (tmp_path / "spool" / "hostile.1").mkdir(parents=True)
    for made_before in (tmp_path / "spool", tmp_path / "spool" / "hostile.1"):
        made_before.chmod(0o777)
    spool = Spool(tmp_path / "spool", "hostile.1", secret="the worker's")
    path = spool.put(report(1))
    spool.keep_changes(1, 1, [{"op": "set", "key": "k", "value": 1}])
    spool.refuse_file(spool.put(report(2)), "for the test")
    for directory in (tmp_path / "spool", spool.directory, spool.aside):
        assert directory.stat().st_mode & 0o777 == 0o700
    for file in (path, spool.directory / "state-ti-1-1.json", spool.directory / ".lock", spool.aside / "ti-2-1.json.reason"):
        assert file.stat().st_mode & 0o777 == 0o600
    state = (spool.directory / "state-ti-1-1.json").read_text()
    assert unsealed(state, kind="task_state", secrets=["the worker's"])["changes"] == [{"op": "set", "key": "k", "value": 1}]
    spool.close()


# --- the bounded decoder ---------------------------------------------------------------------


def test_a_result_may_nest_64_levels_and_no_more():
    assert MAX_DEPTH == 64
    assert check_result(nested(64), 65536) is None
    assert check_result(nested(65), 65536)["problem"] == "too_deep"
    assert check_result(nested(5000), 65536)["problem"] == "too_deep"  # deeper than the encoder's stack


def test_the_depth_scan_counts_brackets_outside_strings_only():
    assert not deeper_than('{"a": "[[[[[[[[[[", "b": [1]}', 2)
    assert deeper_than('{"a": "[[[[[[[[[[", "b": [[1]]}', 2)
    assert not deeper_than('{"a": "[[[[[[[[[[\\"]]]]"}', 1)
    assert deeper_than("[" * 65 + "]" * 65, 64)
    assert not deeper_than("[" * 64 + "]" * 64, 64)
    assert not deeper_than('"' + '\\"' * 200_000, 64)  # an unterminated string: one linear pass


def test_a_message_carries_values_nested_64_levels_and_no_more():
    line = json.dumps({"type": "success", "result": nested(64)}).encode()
    assert decode_message(line, 1 << 20)["result"] == nested(64)
    with pytest.raises(MalformedMessage) as refused:
        decode_message(json.dumps({"type": "success", "result": nested(65)}).encode(), 1 << 20)
    assert refused.value.problem["problem"] == "too_deep"
    assert MESSAGE_MAX_DEPTH == 65
    with pytest.raises(MalformedMessage) as refused:
        decode_message(LINES["deep"].rstrip(b"\n"), 1 << 20)  # the scan, not the decoder's recursion
    assert refused.value.problem["problem"] == "too_deep"


def test_the_size_is_bounded_before_anything_is_decoded():
    bound = message_max_bytes(65536)
    assert bound == 65536 + MESSAGE_MARGIN_BYTES
    fits = b'{"type": "success", "result": "' + b"x" * (bound - 33) + b'"}'
    assert len(fits) == bound
    assert decode_message(fits, bound)
    with pytest.raises(MalformedMessage) as refused:
        decode_message(b"\xff" * (bound + 1), bound)
    assert (refused.value.problem["problem"], refused.value.problem["size_bytes"]) == ("too_large", bound + 1)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"\x00\xff garbage", "not_utf8"),
        (b'{"result": "\xed\xa0\x80"}', "not_utf8"),  # a surrogate, encoded: no UTF-8
        (b"not json", "not_json"),
        (b"", "not_json"),
        (b"[1, 2]", "not_a_message"),
        (b'"a string"', "not_a_message"),
        (b"NaN", "not_a_message"),
    ],
)
def test_a_line_that_is_no_message_says_what_it_is(line, problem):
    with pytest.raises(MalformedMessage) as refused:
        decode_message(line, 1 << 20)
    assert refused.value.problem["problem"] == problem
    assert refused.value.problem["channel"] is True
    assert line.decode("utf-8", "replace") not in json.dumps(refused.value.problem) or not line  # never the text itself


def test_the_reader_takes_messages_until_the_first_that_is_not_one():
    read_fd, write_fd = os.pipe()
    reader = LineReader(read_fd, max_bytes=1024)
    os.write(write_fd, b'{"type": "running"}\n{"type": "x"}\n\xff\n{"type": "success"}\n')
    os.close(write_fd)
    messages = []
    while not reader.eof:
        messages += reader.feed()
    os.close(read_fd)
    assert messages == [{"type": "running"}, {"type": "x"}]
    assert reader.problem["problem"] == "not_utf8"


def test_a_line_with_no_end_is_refused_once_past_the_bound():
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    reader = LineReader(read_fd, max_bytes=100_000)
    writer = threading.Thread(target=lambda: (os.write(write_fd, b"x" * 300_000), os.close(write_fd)))
    writer.start()
    while not reader.eof:
        assert reader.feed() == []
    writer.join()
    os.close(read_fd)
    assert reader.problem["problem"] == "too_large"
    assert reader.unfinished == 0


def test_the_trusted_direction_still_carries_large_results_text():
    """The supervisor's own messages (the upstream results: megabytes of JSON text) are read
    unbounded by the task process, and what a task sends is UTF-8, not escapes."""
    read_fd, write_fd = os.pipe()
    reader = LineReader(read_fd)
    results = {"source": ["é" * 100] * 40_000}
    writer = threading.Thread(target=lambda: (send(write_fd, results), send(write_fd, {"half": "\ud800"}), os.close(write_fd)))
    writer.start()
    received = [reader.receive(timeout=10), reader.receive(timeout=10)]
    writer.join()
    os.close(read_fd)
    assert received == [results, {"half": "\ud800"}]


def test_what_the_channel_refused_is_the_tasks_invalid_result_whatever_it_said():
    problem = MalformedMessage("not_json", "a line that is not JSON").problem
    verdict = classify(Outcome(handshake=True, returncode=-9, final=Succeeded(1), channel_problem=problem))
    assert (verdict.success, verdict.context.category.value, verdict.context.reason.value) == (False, "application", "invalid_result")
    assert verdict.context.metadata["problem"] == "not_json"
    assert verdict.context.metadata["channel"] is True


def test_a_success_the_task_claims_is_checked_again_by_the_worker():
    """A task writing its own success past its process's check: too large, or too deep."""
    too_large = classify(Outcome(handshake=True, returncode=0, final=Succeeded("x" * 70_000)))
    too_deep = classify(Outcome(handshake=True, returncode=0, final=Succeeded(nested(65))))
    assert [v.context.metadata["problem"] for v in (too_large, too_deep)] == ["too_large", "too_deep"]


@pytest.mark.parametrize(
    "message",
    [
        {"type": "bash_exit", "exit_code": "x"},
        {"type": None},
        {"no": "type"},
        {"type": "failure", "exception": "not an object"},
        {"type": "failure", "exception": {"retry_after": "soon"}},
        {"type": "failure", "exception": {"retry_after": float("inf")}},
        {"type": "failure", "exception": {"fingerprint": ["x"]}},
        {"type": "invalid_result", "problem": [1]},
        {"type": "terminated", "context": 1},
        {"type": "running", "pid": "1"},
    ],
)
def test_a_message_no_task_sends_is_refused(message):
    assert message_problem(message)["channel"] is True


def test_a_problem_a_task_reports_cannot_overwrite_the_platforms_metadata():
    said = {"problem": "too_large", "reason": "worker_lost", "source": "scheduler", "worker_name": "forged"}
    verdict = classify(Outcome(handshake=True, returncode=1, final=InvalidResult(said), metadata={"worker_name": "w"}))
    assert (verdict.context.reason.value, verdict.context.source.value, verdict.context.metadata["worker_name"]) == ("invalid_result", "worker", "w")


# --- real workers ----------------------------------------------------------------------------

CHANNEL_PROBLEMS = {
    "garbage": "not_utf8",
    "invalid_utf8": "not_utf8",
    "not_json": "not_json",
    "not_an_object": "not_a_message",
    "oversized": "too_large",
    "deep": "too_deep",
    "not_a_task_message": "unknown_message",
    "bad_retry_after": "malformed_message",
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.integration
def test_what_a_task_writes_on_its_channel_fails_it_as_invalid_result(worker, make_dag):  # noqa: F811
    """Each task writes one hostile line straight on its channel (found in /proc/self/fd), or
    returns a result nested too deep: each attempt fails as application/invalid_result on the
    user's budget, saying what was wrong; none is retried on the platform, none is stored, and
    the worker carries on."""
    tasks = [{"task_id": kind, "python_callable": T + "write_on_channel", "op_kwargs": {"kind": kind}} for kind in CHANNEL_PROBLEMS]
    tasks += [
        {"task_id": "unfinished", "python_callable": T + "leave_a_line_unfinished"},
        {"task_id": "nested_65", "python_callable": T + "return_nested", "op_kwargs": {"depth": 65}},
        {"task_id": "nested_5000", "python_callable": T + "return_nested", "op_kwargs": {"depth": 5000}},
        {"task_id": "nested_64", "python_callable": T + "return_nested", "op_kwargs": {"depth": 64}},
    ]
    dag = make_dag(tasks, retries=0)
    proc = worker(ORCHESTRATOR_WORKER_CONCURRENCY="4")
    run = trigger(dag)
    expected = {**CHANNEL_PROBLEMS, "unfinished": "unfinished", "nested_65": "too_deep", "nested_5000": "too_deep"}
    for task_id, problem in expected.items():
        ti = settle(run, task_id, ("failed", "success", "up_for_retry", "scheduled", "dead_letter"), timeout=60)
        attempt = ti.attempts.get()
        context = attempt.context or {}
        assert (ti.state, attempt.kind, context.get("category"), context.get("reason")) == (
            "failed", "user", "application", "invalid_result"), (task_id, ti.state, context)  # fmt: skip
        assert context["metadata"]["problem"] == problem, (task_id, context)
        assert ti.infrastructure_try_number == 0
        assert ti.result is None
        assert attempt.result is None
        assert "ATTACKER" not in json.dumps(context)  # what it wrote is not copied into the record
    deep = settle(run, "nested_64", ("failed", "success"), timeout=60)
    assert deep.state == "success"
    assert deep.result == return_nested(64)
    assert proc.poll() is None
    log = "".join(proc.log_lines)
    assert "Traceback" not in log, log
    assert "RecursionError" not in log, log


@pytest.mark.django_db(transaction=True)
@pytest.mark.integration
def test_a_report_a_task_forges_in_the_spool_is_never_delivered(worker, make_dag, settings, tmp_path):  # noqa: F811
    """Three attempts running (held by a worker that is gone, their heartbeats not yet overdue);
    a task writes a report of success for each, with the attacker's account as its result, into
    the spool's root, its own worker's directory and an ended worker's directory. With the
    database there to take them, none is delivered: each is set aside, counted and logged as not
    made by this platform, and the three attempts are as they were."""
    settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT = 600  # the held attempts are not presumed lost meanwhile
    spool = tmp_path / "spool"
    victims_dag = make_dag([{"task_id": t, "bash_command": "true"} for t in ("root", "own", "ended")])
    victims_run = trigger(victims_dag)
    holder = WorkerInfo(hostname="gone", worker_name="gone.1", pid=1)
    victims = {}
    for task_id in ("root", "own", "ended"):
        ti = settle(victims_run, task_id, ("queued",))
        assert reporting.claim(ti.pk, ti.attempt_token, holder)
        assert reporting.mark_running(ti.pk, ti.attempt_token)
        victims[task_id] = [ti.pk, ti.attempt_token]
    before = {ti.pk: (ti.state, ti.result, ti.attempt_token) for ti in TaskInstance.objects.filter(dag_run=victims_run)}
    refused_before = _refused_total()
    proc = worker(ORCHESTRATOR_SPOOL_DIR=str(spool))
    attacker = make_dag([{"task_id": "forger", "python_callable": T + "forge_spool_files",
                          "op_kwargs": {"spool": str(spool), "victims": victims}}])  # fmt: skip
    run = trigger(attacker)
    forger = settle(run, "forger", ("success", "failed", "up_for_retry"), timeout=60)
    assert forger.state == "success", forger.last_failure_context
    assert set(forger.result) == {"root", "own", "ended"}
    aside = spool / "set-aside"
    names = {f"ti-{pk}-{token}.json" for pk, token in victims.values()}
    wait_until(lambda: names <= {p.name for p in aside.glob("ti-*.json")}, timeout=30, message="the forged reports set aside")
    for name in names:
        assert Path(aside / f"{name}.reason").read_text().startswith("not made by this platform")
    assert _refused_total() - refused_before == 3
    wait_until(lambda: "".join(proc.log_lines).count("not made by this platform") >= 3, timeout=10, message="the refusals logged")
    after = {ti.pk: (ti.state, ti.result, ti.attempt_token) for ti in TaskInstance.objects.filter(dag_run=victims_run)}
    assert after == before
    assert all(state == "running" for state, _, _ in after.values())
    assert not TaskInstance.objects.filter(result__iban="ATTACKER").exists()
    waiting = [p for p in spool.rglob("ti-*.json") if p.parent != aside]
    assert not waiting  # nothing left to deliver later
    assert proc.poll() is None


def _refused_total() -> int:
    return sum(n for _, n in metrics.read(metrics.SPOOL_FILES_REFUSED))


def test_no_process_a_python_task_can_read_shows_the_platforms_settings_as_its_environment(worker, make_dag):  # noqa: F811
    """A forked task's /proc/self/environ is the block its fork server was started with, whatever
    os.environ says after: the fork server is started with the task environment alone, and gets
    its own settings (the addresses, its throwaway key, ORCHESTRATOR_*) over its socket."""
    dag = make_dag([{"task_id": "who", "python_callable": "tests.hostile.tasks.who_am_i"}])
    worker(ORCHESTRATOR_TASK_ENV_DENY="ORCHESTRATOR_TEST_DENIED", ORCHESTRATOR_TEST_DENIED="deny-me")
    seen = settle(trigger(dag), "who", ("success",), timeout=60).result
    for block in (seen["proc_environment"], seen["server_proc_environment"]):
        assert isinstance(block, list), block  # this test's worker runs as root: it reads both
        assert block
        assert not platform_names(block), block
        assert not any("deny-me" in entry for entry in block)
    assert "PATH" in {entry.partition("=")[0] for entry in seen["proc_environment"]}


def test_a_python_task_holds_its_channel_and_no_other_descriptor_but_0_1_and_2(worker, make_dag):  # noqa: F811
    """The channel is one socket, both ways: nothing else of the worker's or the fork server's
    (their sockets, pipes, files) reaches the task process."""
    dag = make_dag([{"task_id": "fds", "python_callable": "tests.hostile.channel_tasks.descriptors"}])
    worker()
    held = settle(trigger(dag), "fds", ("success",), timeout=60).result
    others = {fd: what for fd, what in held.items() if fd not in ("0", "1", "2")}
    assert len(others) == 1, held
    assert next(iter(others.values())).startswith("socket:"), held
