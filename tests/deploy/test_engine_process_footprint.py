"""The worker and the scheduler serve no page: they start without loading the web API's
framework (django-ninja, pydantic: some 14 MiB of each process), which Django's URL checks
would import, nor the admin's modules and what they import (django-rq's statistics views,
prometheus_client). Real `run_worker` and `run_scheduler` processes, their mapped files read
once they are up; a fresh interpreter for what `django.setup()` loads."""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

# A compiled part of pydantic, mapped into any process that imported it.
API_LIBRARY = "pydantic_core"


def _mapped_files(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_a_worker_starts_without_the_web_api(spawn):
    from orchestrator.foundation.redis_conn import get_redis

    name = f"footprint-{uuid.uuid4().hex[:8]}"
    worker = spawn("run_worker", name, "--name", name, "--concurrency", "1")  # a queue of its own
    wait_until(lambda: get_redis().exists(f"rq:worker:{name}") or worker.poll() is not None, timeout=60, message="the worker to register")
    assert worker.poll() is None, worker.stdout.read() if worker.stdout else ""
    maps = _mapped_files(worker.pid)
    assert "psycopg" in maps or "libpq" in maps or "sqlite" in maps  # it is up: it has its database driver
    assert API_LIBRARY not in maps


def test_a_scheduler_starts_without_the_web_api(spawn):
    from orchestrator.foundation.redis_conn import get_redis

    client = get_redis()
    for key in client.scan_iter("orchestrator:alive:scheduler:*"):
        client.delete(key)
    scheduler = spawn("run_scheduler")
    wait_until(
        lambda: any(client.scan_iter("orchestrator:alive:scheduler:*")) or scheduler.poll() is not None,
        timeout=60,
        message="the scheduler's first pass",
    )
    assert scheduler.poll() is None, scheduler.stdout.read() if scheduler.stdout else ""
    assert API_LIBRARY not in _mapped_files(scheduler.pid)


SETUP_THEN_URLS = """
import json, sys
import django
django.setup()
loaded = sorted(m for m in ("orchestrator.admin", "django_rq.stats_views", "prometheus_client") if m in sys.modules)
import orchestrator.urls
from django.contrib import admin
from orchestrator.models import Dag
print(json.dumps({"loaded_by_setup": loaded, "admin_after_urls": admin.site.is_registered(Dag)}))
"""


def test_setup_loads_no_admin_module_and_the_pages_register_them(process_env):
    done = subprocess.run([sys.executable, "-c", SETUP_THEN_URLS], env=process_env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"loaded_by_setup": [], "admin_after_urls": True}
