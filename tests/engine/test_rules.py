"""Trigger rules and run outcomes (pure)."""
import pytest

from orchestrator.engine.rules import Readiness, readiness, run_outcome

S, F, UF, SK, N, R, DL = "success", "failed", "upstream_failed", "skipped", "none", "running", "dead_letter"


@pytest.mark.parametrize(
    ("rule", "upstream", "expected"),
    [
        ("all_success", [S, S], Readiness.RUN),
        ("all_success", [S, R], Readiness.WAIT),
        ("all_success", [S, F], Readiness.UPSTREAM_FAILED),
        ("all_success", [S, SK], Readiness.SKIPPED),
        ("all_success", [S, DL], Readiness.WAIT),
        ("all_done", [S, F], Readiness.RUN),
        ("all_done", [S, DL], Readiness.WAIT),
        ("one_success", [F, R], Readiness.WAIT),
        ("one_success", [F, S], Readiness.RUN),
        ("one_success", [F, UF], Readiness.UPSTREAM_FAILED),
        ("one_failed", [S, F], Readiness.RUN),
        ("one_failed", [S, S], Readiness.SKIPPED),
        ("none_failed", [S, SK], Readiness.RUN),
        ("none_failed", [S, UF], Readiness.UPSTREAM_FAILED),
        ("all_success", [], Readiness.RUN),
    ],
)
def test_it_applies_trigger_rules(rule, upstream, expected):
    """Each trigger rule gives the documented readiness."""
    assert readiness(rule, upstream) is expected


def test_it_keeps_a_run_open_while_a_task_is_dead_lettered():
    """A dead-lettered task is not done, so the run has no outcome yet."""
    assert run_outcome([S, DL]) is None
    assert run_outcome([S, S, SK]) == "success"
    assert run_outcome([S, UF, F]) == "failed"
