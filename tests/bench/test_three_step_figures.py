"""The three-step benchmark's figures as its harness defines them, and the server time its web
server reports."""
from __future__ import annotations

import math

import pytest
from django.conf import settings
from django.test import override_settings

from bench.flowstats import end_to_end, flows_per_second, p95
from bench.servertiming import parse
from bench.three_step import STEPS, three_step_spec


def test_p95_is_the_nearest_rank():
    assert p95([i / 1000 for i in range(1, 101)]) == 0.095
    assert p95([0.5]) == 0.5
    assert p95([3.0, 1.0, 2.0]) == 3.0  # ceil(0.95 * 3) = 3rd smallest
    assert math.isnan(p95([]))


def test_end_to_end_gives_milliseconds_and_the_median_over_three_steps():
    figures = end_to_end([0.030, 0.060, 0.090, 0.120])
    assert figures == {"n": 4, "median_ms": 75.0, "p95_ms": 120.0, "max_ms": 120.0, "per_step_ms": 25.0}
    assert end_to_end([])["median_ms"] is None


def test_flows_per_second_counts_from_the_first_trigger_to_the_last_end():
    assert flows_per_second(4, 100.0, [100.5, 101.0, 102.0, 100.2]) == 2.0
    # A flow whose end is missing, or ends not after the first trigger, gives no rate.
    assert flows_per_second(4, 100.0, [101.0, 102.0, 100.2]) is None
    assert flows_per_second(1, 100.0, [99.0]) is None


def test_server_timing_is_read_leniently():
    assert parse("app;dur=12.5, db;dur=3.25, queries;dur=7") == {"app": 12.5, "db": 3.25, "queries": 7.0}
    assert parse(None) == {}
    assert parse("app;dur=x, ;dur=1, db;desc=y, total;dur=2") == {"total": 2.0}


def test_the_flow_is_three_steps_in_sequence():
    spec = three_step_spec()
    assert [(t["task_id"], t["upstream"]) for t in spec["tasks"]] == list(STEPS.items())
    assert [t["upstream"] for t in spec["tasks"]] == [[], ["step_1"], ["step_2"]]


@pytest.mark.django_db
def test_the_timing_middleware_reports_django_and_sql_time(client):
    with override_settings(MIDDLEWARE=["bench.servertiming.ServerTiming", *settings.MIDDLEWARE]):
        response = client.get("/api/v1/dags", headers={"host": "127.0.0.1"})
    figures = parse(response["Server-Timing"])
    assert set(figures) == {"app", "db", "queries"}
    assert figures["app"] >= figures["db"] >= 0
    assert response.status_code in (200, 401)
