"""Schemathesis against the live API: a real server process, real HTTP, a real bearer token.

Every operation of /api/v1/openapi.json is called with examples and generated inputs (valid
and invalid); the run fails on any 5xx and on any response the document does not describe
(status, content type, headers, body). Bounded: a few examples per operation, a fixed seed.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import urllib.request
from datetime import datetime, timezone

import pytest
from django.contrib.auth.models import User

from tests.api.factories import chain_dag, fail, make_run, succeed
from tests.conftest import ROOT, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

MAX_EXAMPLES = 10
SEED = 20260101


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def seed_data() -> None:
    """The objects the document's examples name (DAG etl, its 2026-01-01 manual run, task extract)."""
    dag = chain_dag("etl")
    run = make_run(dag, at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    succeed(run, "extract")
    fail(run, "transform", stderr="ValueError: bad row\n")
    chain_dag("paused_dag")
    # A scheduled DAG with a backfill, for the backfill endpoints.
    from orchestrator.operations import backfills

    daily = chain_dag("daily")
    daily.schedule = "@daily"
    daily.save()
    backfills.create(backfills.check(daily, start="2026-01-01", end="2026-01-03"), None, created_by="seed")


def api_token(process_env: dict[str, str]) -> str:
    User.objects.create_superuser("fuzzer", "fuzzer@example.com", "unused-password-1")
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "create_api_token", "fuzzer"],
        env=process_env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/healthz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def drain(stream) -> list[str]:
    """Keep reading the server's log so its pipe never fills."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(stream), daemon=True).start()
    return lines


def tracebacks(log: list[str]) -> str:
    """The server's tracebacks, which say where a 500 came from."""
    starts = [i for i, line in enumerate(log) if line.startswith("Traceback")]
    return "".join("".join(log[i : i + 60]) for i in starts[:3])


def test_the_live_api_answers_as_its_openapi_document_says(spawn, process_env, tmp_path):
    seed_data()
    token = api_token(process_env)
    base = f"http://127.0.0.1:{free_port()}"
    server = spawn("runserver", "--noreload", base.removeprefix("http://"), env={"DEBUG": "false", "SECURE_SSL_REDIRECT": "false"})
    log = drain(server.stdout)
    wait_until(lambda: healthy(base) or server.poll() is not None, timeout=60, message="the server to answer /healthz")
    assert server.poll() is None, "".join(log)[-5000:]

    result = subprocess.run(
        [
            sys.executable, "-m", "schemathesis.cli", "run", f"{base}/api/v1/openapi.json",
            "--header", f"Authorization: Bearer {token}",
            # All checks but one: a schema-valid request must be accepted, but JSON Schema cannot
            # say "no NUL at any depth" of a free-form conf without recursion, so the generators
            # send NULs the API rightly refuses (400). NULs are still sent, so a 500 is still found.
            "--checks", "all", "--exclude-checks", "positive_data_acceptance",
            # Not the coverage phase: its pattern generator now and then trips on an assertion of its
            # own (a Runtime Error inside Schemathesis, not a finding about the API).
            "--phases", "examples,fuzzing",
            "--max-examples", str(MAX_EXAMPLES),
            "--seed", str(SEED),
            "--workers", "2",
            "--request-timeout", "20",
            "--generation-database", "none",
            "--no-color",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:] + tracebacks(log)
