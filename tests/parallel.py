"""Each test process of a parallel run (`pytest -n N`, pytest-xdist) gets a Redis database of
its own, from the list `bin/test` claimed (TEST_REDIS_URLS), so that their queues, workers and
counters never meet. Loaded with `-p` (see pyproject.toml), before Django reads its settings;
the databases get their own names from pytest-django."""
from __future__ import annotations

import os

worker = os.environ.get("PYTEST_XDIST_WORKER", "")
claimed = [url for url in os.environ.get("TEST_REDIS_URLS", "").split() if url]
if worker.startswith("gw") and claimed:
    index = int(worker[2:])
    if index >= len(claimed):
        raise RuntimeError(f"test process {worker} has no Redis database: bin/test claimed {len(claimed)}; run it with the same -n")
    os.environ["REDIS_URL"] = claimed[index]
