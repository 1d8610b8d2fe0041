"""Deadline callbacks run by a real RQ worker (in this process, on a queue of their own)."""
from __future__ import annotations

import json
import logging
import multiprocessing
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from django.core import mail
from django.test import override_settings
from django.utils import timezone
from rq import Queue, SimpleWorker

from deadlines.callbacks import run_callback
from deadlines.check import check_due
from deadlines.models import Deadline
from orchestrator.engine.run_creation import create_run
from orchestrator.foundation.redis_conn import get_redis
from tests.deadlines.callables import read_calls
from tests.deadlines.factories import DeadlineDefinitionFactory, chain_dag

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "deadline-callback-tests"


@pytest.fixture(autouse=True)
def clean_queue():
    Queue(QUEUE, connection=get_redis()).empty()
    yield
    Queue(QUEUE, connection=get_redis()).empty()


def work() -> None:
    """Run every queued callback job with a real RQ worker, then return."""
    connection = get_redis()
    SimpleWorker([Queue(QUEUE, connection=connection)], connection=connection).work(burst=True)


def missed(dag_id: str, callback: str, **kwargs) -> Deadline:
    """A DAG whose run is 60 s past its need-by and checked: the callback is queued."""
    dag = chain_dag(dag_id)
    DeadlineDefinitionFactory(dag=dag, interval=60, callback=callback, callback_kwargs={"queue": QUEUE, **kwargs})
    queued = timezone.now() - timedelta(seconds=120)
    run = create_run(dag, run_type="manual", logical_date=queued, now=queued)
    check_due(timezone.now())
    return run.deadlines.get()


def test_it_calls_a_dotted_path_callback_with_its_kwargs_and_the_context(tmp_path):
    """The callable gets callback_kwargs (without the reserved queue/timeout) and the context."""
    out = tmp_path / "calls.jsonl"
    deadline = missed("custom", "tests.deadlines.callables.append_to_file", path=str(out), channel="#data", timeout=5)
    work()
    (call,) = read_calls(out)
    assert call["kwargs"] == {"channel": "#data"}
    context = call["context"]
    assert context["dag_id"] == "custom"
    assert context["task_id"] is None
    assert context["at_risk"] is False
    assert context["reference"] == "dagrun_queued_at"
    assert context["need_by"] == deadline.need_by.isoformat()
    assert context["lateness_seconds"] == pytest.approx(60, abs=5)
    assert context["run_id"] == deadline.dag_run.run_id
    assert context["idempotency_key"] == f"deadline-{deadline.pk}-missed"  # the same on any re-delivery
    deadline.refresh_from_db()
    assert (deadline.callback_state, deadline.callback_attempts, deadline.callback_error) == ("success", 1, "")


def test_it_calls_a_callable_without_a_context_parameter_with_its_kwargs_only(tmp_path):
    """Like a task callable: no `context` parameter, no context."""
    out = tmp_path / "called"
    deadline = missed("plain", "tests.deadlines.callables.no_context", path=str(out))
    work()
    assert out.read_text() == "called"
    deadline.refresh_from_db()
    assert deadline.callback_state == "success"


@override_settings(ORCHESTRATOR_DEADLINE_CALLBACK_ATTEMPTS=2, ORCHESTRATOR_DEADLINE_CALLBACK_RETRY_DELAY=0)
def test_it_retries_a_raising_callback_then_records_it_failed_with_the_error():
    """A callback that raises is retried by the check, then failed with the error kept."""
    deadline = missed("raises", "tests.deadlines.callables.explode")
    work()
    deadline.refresh_from_db()
    assert (deadline.callback_state, deadline.callback_attempts) == ("queued", 1)
    assert deadline.callback_error == "dispatch 1 of 2: RuntimeError: pager service is down"
    check_due(timezone.now() + timedelta(seconds=1))
    work()
    deadline.refresh_from_db()
    assert (deadline.state, deadline.callback_state, deadline.callback_attempts) == ("missed", "failed", 2)
    assert deadline.callback_error == "dispatch 2 of 2: RuntimeError: pager service is down"


@override_settings(ORCHESTRATOR_DEADLINE_CALLBACK_ATTEMPTS=1)
def test_it_fails_a_hanging_callback_at_its_timeout_and_still_runs_the_others(tmp_path):
    """A callback that hangs is cut off at callback_kwargs.timeout; the next callback runs all the same."""
    out = tmp_path / "calls.jsonl"
    hung = missed("hangs", "tests.deadlines.callables.hang", seconds=30, timeout=0.5)
    fine = missed("fine", "tests.deadlines.callables.append_to_file", path=str(out))
    started = time.monotonic()
    work()
    assert time.monotonic() - started < 10
    hung.refresh_from_db()
    fine.refresh_from_db()
    assert (hung.callback_state, hung.callback_error) == ("failed", "dispatch 1 of 1: CallbackTimeout: callback did not return within 0.5s")
    assert fine.callback_state == "success"
    assert len(read_calls(out)) == 1
    assert multiprocessing.active_children() == []  # the hung callback's process was killed


def test_it_fails_an_unimportable_callback_at_once():
    """A dotted path that does not import is a permanent failure: no retries."""
    deadline = missed("gone", "tests.deadlines.callables.no_such_function")
    work()
    deadline.refresh_from_db()
    assert (deadline.callback_state, deadline.callback_attempts) == ("failed", 1)
    assert "cannot import callback 'tests.deadlines.callables.no_such_function'" in deadline.callback_error


def test_it_ignores_a_stale_dispatch():
    """A job whose dispatch token is no longer current changes nothing and calls nothing."""
    deadline = missed("stale", "tests.deadlines.callables.explode")
    assert run_callback(deadline.pk, "missed", 7) == "stale"
    deadline.refresh_from_db()
    assert (deadline.callback_state, deadline.callback_error) == ("queued", "")


def test_it_logs_with_the_log_notifier(caplog):
    """notifier:log writes a headline and the whole context to the deadlines.notifier log."""
    deadline = missed("logged", "notifier:log", message="call the on-call")
    with caplog.at_level(logging.WARNING, logger="deadlines.notifier"):
        work()
    (record,) = [r for r in caplog.records if r.name == "deadlines.notifier"]
    text = record.getMessage()
    assert "[deadline missed] logged" in text
    assert "call the on-call" in text
    assert '"reference": "dagrun_queued_at"' in text
    deadline.refresh_from_db()
    assert deadline.callback_state == "success"


@override_settings(EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend")
def test_it_sends_mail_with_the_email_notifier():
    """notifier:email sends one message to callback_kwargs.to."""
    mail.outbox.clear()
    deadline = missed("mailed", "notifier:email", to=["elmo@example.com"])
    work()
    (message,) = mail.outbox
    assert message.to == ["elmo@example.com"]
    assert message.subject.startswith("[deadline missed] mailed")
    deadline.refresh_from_db()
    assert deadline.callback_state == "success"


def test_it_fails_the_email_notifier_without_recipients():
    """notifier:email without `to` is a permanent failure naming the missing kwarg."""
    deadline = missed("nobody", "notifier:email")
    work()
    deadline.refresh_from_db()
    assert deadline.callback_state == "failed"
    assert "callback_kwargs.to" in deadline.callback_error


class Hook:
    """A local HTTP server that records JSON POSTs and answers `status`."""

    def __init__(self, status: int = 204) -> None:
        received: list[dict] = []
        self.received = received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                received.append(
                    {
                        "path": self.path,
                        "type": self.headers["Content-Type"],
                        "key": self.headers["Idempotency-Key"],
                        "body": json.loads(self.rfile.read(length)),
                    }
                )
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/SECRET-TOKEN"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook():
    server = Hook()
    yield server
    server.close()


@override_settings(ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS=["127.0.0.1"])
def test_it_posts_json_to_an_allowed_webhook(hook):
    """notifier:webhook POSTs the context as JSON to the URL."""
    deadline = missed("hooked", "notifier:webhook", url=hook.url)
    work()
    (request,) = hook.received
    assert request["path"] == "/hooks/SECRET-TOKEN"
    assert request["type"] == "application/json"
    assert request["body"]["event"] == "deadline_missed"
    assert request["body"]["dag_id"] == "hooked"
    assert request["key"] == request["body"]["idempotency_key"] == f"deadline-{deadline.pk}-missed"
    deadline.refresh_from_db()
    assert deadline.callback_state == "success"


@override_settings(ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS=["hooks.example.com"])
def test_it_refuses_a_webhook_host_not_allowed_at_call_time(hook):
    """The allow-list is checked again when calling: a host not on it is never contacted."""
    deadline = missed("refused", "notifier:webhook", url=hook.url)
    work()
    assert hook.received == []
    deadline.refresh_from_db()
    assert deadline.callback_state == "failed"
    assert deadline.callback_attempts == 1
    assert "'127.0.0.1' is not in ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS" in deadline.callback_error


@override_settings(ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS=["127.0.0.1"], ORCHESTRATOR_DEADLINE_CALLBACK_ATTEMPTS=1)
def test_it_records_a_webhook_error_without_the_url():
    """An HTTP 500 fails the callback; the error names the host only, never the secret-bearing URL."""
    server = Hook(status=500)
    try:
        deadline = missed("broken_hook", "notifier:webhook", url=server.url)
        work()
    finally:
        server.close()
    deadline.refresh_from_db()
    assert deadline.callback_state == "failed"
    assert "webhook 127.0.0.1 answered HTTP 500" in deadline.callback_error
    assert "SECRET" not in deadline.callback_error


def test_it_rejects_unknown_notifier_kwargs():
    """A typo in a notifier's kwargs is a permanent failure naming the key."""
    deadline = missed("typo", "notifier:log", levle="error")
    work()
    deadline.refresh_from_db()
    assert deadline.callback_state == "failed"
    assert "unknown callback_kwargs levle" in deadline.callback_error
