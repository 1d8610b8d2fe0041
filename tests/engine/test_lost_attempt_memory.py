"""An attempt reported by the scheduler (its worker lost) still shows the memory limit it ran with."""
from __future__ import annotations

import pytest

from orchestrator.engine import reporting
from retries.context import ExecutionContext
from retries.states import Reason, Source
from tests.api.factories import chain_dag, make_run, start

pytestmark = pytest.mark.django_db


def test_an_attempt_whose_worker_was_lost_keeps_the_limit_it_ran_with():
    run = make_run(chain_dag("lost", ("only",), memory_limit=64))
    ti = start(run, "only")
    reporting.report_failure(ti.pk, ti.attempt_token, ExecutionContext.of(Reason.WORKER_LOST, Source.SCHEDULER))
    attempt = ti.attempts.get()
    assert (attempt.state, attempt.memory_limit_mib, attempt.peak_memory_mib) == ("failed", 64, None)


def test_an_attempt_without_a_limit_shows_none():
    run = make_run(chain_dag("lost-unlimited", ("only",)))
    ti = start(run, "only")
    reporting.report_failure(ti.pk, ti.attempt_token, ExecutionContext.of(Reason.WORKER_LOST, Source.SCHEDULER))
    assert ti.attempts.get().memory_limit_mib is None
