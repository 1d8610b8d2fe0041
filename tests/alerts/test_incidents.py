"""Events join incidents: routing by category and owner, grouping, repeat and resolve. A report
only queues its event (one INSERT in its own transaction); the sender counts the queued events
in their incidents (`incidents.absorb`), which these tests call as the sender's loop does."""
from __future__ import annotations

from datetime import timedelta

import pytest

from alerts import incidents, rules_cache
from alerts.models import AlertEvent, Delivery, Incident
from orchestrator import listeners
from orchestrator.foundation.clock import shared_now
from orchestrator.models import TaskInstance
from retries.states import Reason, RunState
from tests.alerts.helpers import fail, rule, run_of, succeed, ti_of

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_routes_by_category_and_owner():
    """Infrastructure failures go to the platform's rule, application failures to the owning team's only."""
    platform = rule("platform", category=["infrastructure"])
    data = rule("data", category=["application"], owner=["data-team"])
    theirs, other = run_of("etl", owner="data-team"), run_of("web", owner="web-team")
    fail(theirs, reason=Reason.WORKER_LOST)
    fail(theirs)
    fail(other)
    assert incidents.absorb() == 2
    assert list(Incident.objects.filter(rule=platform).values_list("count", flat=True)) == [1]
    (incident,) = Incident.objects.filter(rule=data)
    assert incident.count == 1
    assert incident.sample["dag_id"] == "etl"
    assert incident.sample["reason"] == "task_exception"
    assert incident.sample["message"] == "KeyError: 'x'"


def test_it_sends_one_notification_for_three_failures_of_one_group():
    r = rule("by-reason", group_by=["category", "reason"])
    runs = [run_of(f"d{i}") for i in range(3)]
    for run in runs:
        fail(run)
    assert not Incident.objects.exists()  # the reports queued their events, nothing more
    assert incidents.absorb() == 3
    (incident,) = Incident.objects.filter(rule=r)
    assert incident.count == 3
    assert incident.group == {"category": "application", "reason": "task_exception"}
    assert list(incident.deliveries.values_list("event", flat=True)) == ["opened"]
    assert incident.feeds.count() == 3


def test_a_rule_groups_apart_what_differs_in_its_keys():
    r = rule("by-dag", group_by=["dag_id"])
    a, b = run_of("a"), run_of("b")
    fail(a)
    fail(a)
    fail(b)
    incidents.absorb()
    assert sorted(Incident.objects.filter(rule=r).values_list("group__dag_id", "count")) == [("a", 2), ("b", 1)]


def test_a_dead_letter_and_every_failed_attempt_are_events_of_their_own():
    failed, dead = rule("each", when="task_failed"), rule("dead", when="task_dead_lettered", reason=["poisoned"])
    run = run_of("p", retries=5)
    from orchestrator.models import Dag

    Dag.objects.filter(dag_id="p").update(default_args={"retries": 5, "retry_delay": 0, "poison_threshold": 2})
    TaskInstance.objects.filter(dag_run=run).update(max_tries=6)
    fail(run)
    fail(run)
    assert incidents.absorb() == 3
    assert Incident.objects.get(rule=failed).count == 2
    assert ti_of(run).state == "dead_letter"
    assert Incident.objects.get(rule=dead).sample["reason"] == "poisoned"


def test_it_repeats_after_repeat_after_while_open():
    r = rule("rep", repeat_after=60)
    fail(run_of("x"))
    incidents.absorb()
    incident = Incident.objects.get(rule=r)
    now = shared_now()
    assert incidents.queue_repeats(now + timedelta(seconds=30)) == 0
    assert incidents.queue_repeats(now + timedelta(seconds=61)) == 1
    assert incidents.queue_repeats(now + timedelta(seconds=62)) == 0  # 60 s after the last notification, not the first
    assert incidents.queue_repeats(now + timedelta(seconds=122)) == 1
    assert list(incident.deliveries.values_list("event", flat=True)) == ["opened", "repeat", "repeat"]


def test_it_resolves_once_every_task_that_fed_it_succeeded_and_a_later_event_opens_a_new_one():
    r = rule("res", resolve=True)
    one, two = run_of("one"), run_of("two")
    fail(one)
    fail(two)
    incidents.absorb()
    incident = Incident.objects.get(rule=r)
    succeed(one)
    assert incidents.resolve_over(shared_now()) == 0  # "two" still failing
    succeed(two)
    assert incidents.resolve_over(shared_now()) == 1
    incident.refresh_from_db()
    assert incident.state == "resolved"
    assert incident.resolved_at is not None
    assert list(incident.deliveries.values_list("event", flat=True)) == ["opened", "resolved"]
    assert incidents.resolve_over(shared_now()) == 0  # resolved once
    fail(run_of("three"))
    incidents.absorb()
    assert Incident.objects.filter(rule=r, state="open").count() == 1
    assert Incident.objects.filter(rule=r).count() == 2


def test_a_rule_without_resolve_closes_silently():
    r = rule("quiet", resolve=False)
    run = run_of("q")
    fail(run)
    incidents.absorb()
    succeed(run)
    assert incidents.resolve_over(shared_now()) == 1
    assert list(Delivery.objects.filter(incident__rule=r).values_list("event", flat=True)) == ["opened"]


def test_a_failed_run_is_an_event_through_the_listener_hook():
    r = rule("runs", when="run_failed", owner=["ops"])
    run = run_of("rf", owner="ops", retries=0)
    fail(run)
    from orchestrator.engine.run_advance import advance_run

    advance_run(run.pk)
    run.refresh_from_db()
    assert run.state == RunState.FAILED
    assert listeners.drain()
    incidents.absorb()
    (incident,) = Incident.objects.filter(rule=r)
    assert incident.sample["run_id"] == run.run_id
    assert incident.sample["task_id"] is None
    assert incident.sample["reason"] == "task_exception"


def test_no_rule_no_query(django_assert_max_num_queries):
    """With no rules (read once), a failure's report costs what it did before alerts existed."""
    run = run_of("cheap")
    fail(run)  # reads the (empty) rules once
    from alerts import events
    from retries.context import ExecutionContext
    from retries.states import Source

    ti = TaskInstance.objects.select_related("dag_run__dag").get(dag_run=run)
    with django_assert_max_num_queries(0):
        events.task_failed(ti, ExecutionContext.of(Reason.TASK_EXCEPTION, Source.WORKER), fingerprint=None)


def _report_queries(run) -> list[str]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        fail(run)
    return [q["sql"] for q in captured.captured_queries]


def test_a_matching_rule_adds_one_insert_to_the_report_and_no_incident_write(monkeypatch, caches_held):
    """The report only queues the event: one more statement, an INSERT of the event row in the
    report's own transaction; the incident (a row every failure of the group would update) is
    the sender's."""
    monkeypatch.setattr(rules_cache, "REFRESH", 3600.0)  # no read of the rules' version in the way
    fail(run_of("warm"))  # the rules (none) read once
    without = _report_queries(run_of("none"))
    rule("every", group_by=["category", "reason"])
    fail(run_of("warm-again"))  # the rule read once
    with_rule = _report_queries(run_of("one"))
    extra = [sql for sql in with_rule if sql not in without]
    assert len(with_rule) == len(without) + 1, extra
    (insert,) = [sql for sql in with_rule if "alerts_" in sql]
    assert insert.startswith('INSERT INTO "alerts_alertevent"')
    assert AlertEvent.objects.count() == 2
    assert not Incident.objects.exists()


def test_the_sender_counts_a_storm_of_one_group_with_one_update_of_its_incident():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    r = rule("storm", group_by=["reason"])
    runs = [run_of(f"s{i}") for i in range(3)]
    for run in runs:
        fail(run)
    assert incidents.absorb() == 3  # opened
    more = [run_of(f"m{i}") for i in range(20)]
    for run in more:
        fail(run)
    with CaptureQueriesContext(connection) as captured:
        assert incidents.absorb() == 20
    updates = [q["sql"] for q in captured.captured_queries if q["sql"].startswith('UPDATE "alerts_incident"')]
    assert len(updates) <= 2  # the count, and the last event's time and sample
    (incident,) = Incident.objects.filter(rule=r)
    assert incident.count == 23
    assert incident.feeds.count() == 23
    assert incident.sample["dag_id"] == "m19"  # the latest event's
    assert not AlertEvent.objects.exists()
    assert incidents.absorb() == 0


def test_an_incident_stays_open_while_an_event_of_its_group_is_queued():
    r = rule("pending", resolve=True)
    one, two = run_of("one"), run_of("two")
    fail(one)
    incidents.absorb()
    fail(two)  # queued, not counted yet
    succeed(one)
    assert incidents.resolve_over(shared_now()) == 0
    incidents.absorb()
    assert incidents.resolve_over(shared_now()) == 0  # "two" fed it and still fails
    succeed(two)
    assert incidents.resolve_over(shared_now()) == 1
    assert Incident.objects.get(rule=r).count == 2


def test_events_of_a_deleted_rule_are_dropped():
    r = rule("gone")
    fail(run_of("x"))
    r.delete()
    assert incidents.absorb() == 1
    assert not AlertEvent.objects.exists()
    assert not Incident.objects.exists()


def test_the_sample_of_a_tasks_traceback_is_its_exception():
    """A worker reports a task's exception as its traceback: the sample says the exception."""
    rule("tb")
    traceback = 'Traceback (most recent call last):\n  File "/srv/etl.py", line 10, in transform\n    row["customer_id"]\nKeyError: \'customer_id\'\n'
    fail(run_of("tb"), error=traceback)
    incidents.absorb()
    assert Incident.objects.get().sample["message"] == "KeyError: 'customer_id'"


@pytest.mark.parametrize("error", ["KeyError: '\x00'", "bad \udcff bytes", "x" * 1_000_000])
def test_a_hostile_error_text_never_fails_the_report(error):
    """The event rides in the report's transaction: its text is made safe before it is stored."""
    rule("hostile")
    run = run_of("hostile")
    fail(run, error=error)  # the report returns its decision: it was recorded
    assert ti_of(run).attempts.filter(state="failed").count() == 1
    incidents.absorb()
    message = Incident.objects.get().sample["message"]
    assert "\x00" not in message
    assert len(message) <= 500
    message.encode()  # valid UTF-8
