"""The DAG admin: the rules of `import_dags`, enforced on the DAG page and its task and deadline rows."""
from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from deadlines.models import DeadlineDefinition
from orchestrator.models import AuditLog, Dag, DagRun, Task
from tests.admin.conftest import dag_post, errors_of
from tests.specs.conftest import snapshot

pytestmark = pytest.mark.django_db

ADD_URL = "/admin/orchestrator/dag/add/"
LIST_URL = "/admin/orchestrator/dag/"
DIAMOND = [
    {"task_id": "extract", "python_callable": "examples.etl.extract", "op_kwargs": '{"source": "memory://x"}'},
    {"task_id": "a", "python_callable": "examples.etl.transform_a", "upstream": "extract"},
    {"task_id": "b", "bash_command": "echo b", "upstream": "extract", "retries": "4", "execution_timeout": "30", "queue": "heavy"},
    {"task_id": "load", "python_callable": "examples.etl.load", "upstream": "a, b", "args": '{"retry_delay": 5}'},
]


def change_url(dag: Dag) -> str:
    return f"/admin/orchestrator/dag/{dag.pk}/change/"


def test_it_accepts_a_valid_dag_with_tasks_and_a_deadline(admin_client) -> None:
    """A valid DAG is saved with its tasks in order, typed overrides folded into args, and its deadline."""
    data = dag_post(
        schedule="0 2 * * *",
        timezone="Europe/Amsterdam",
        default_args='{"retries": 2}',
        tasks=[*DIAMOND, {}],  # plus the blank extra row a browser sends
        deadlines=[
            {
                "reference": "fixed_datetime",
                "datetime_text": "2026-12-31T23:00:00",
                "callback": "notifier:log",
                "days": "mon, fri",
            }
        ],
    )
    response = admin_client.post(ADD_URL, data)
    assert response.status_code == 302, errors_of(response)

    dag = Dag.objects.get(dag_id="payments")
    assert (dag.schedule, dag.timezone, dag.default_args) == ("0 2 * * *", "Europe/Amsterdam", {"retries": 2})
    tasks = {task.task_id: task for task in dag.tasks.all()}
    assert [t.task_id for t in dag.tasks.order_by("position")] == ["extract", "a", "b", "load"]
    assert tasks["load"].upstream == ["a", "b"]
    assert tasks["b"].args == {"retries": 4, "execution_timeout": 30, "queue": "heavy"}
    assert tasks["load"].args == {"retry_delay": 5}
    assert tasks["extract"].op_kwargs == {"source": "memory://x"}
    deadline = DeadlineDefinition.objects.get(dag=dag)
    assert deadline.task is None
    assert deadline.days == ["mon", "fri"]
    assert deadline.datetime == datetime(2026, 12, 31, 23, tzinfo=ZoneInfo("Europe/Amsterdam"))
    assert deadline.datetime_text == "2026-12-31T23:00:00"


@pytest.mark.parametrize(
    ("change", "shown"),
    [
        ({"tasks": [{**DIAMOND[0], "upstream": "load"}, *DIAMOND[1:]]}, "cycle: "),
        ({"tasks": [*DIAMOND[:3], {**DIAMOND[3], "upstream": "a, nope"}]}, "unknown task &#x27;nope&#x27;"),
        ({"tasks": [*DIAMOND[:3], {**DIAMOND[3], "task_id": "a"}]}, "duplicate"),
        ({"schedule": "99 * * * *"}, "invalid cron expression"),
        ({"timezone": "Europe/Atlantis"}, "unknown timezone"),
        ({"tasks": [{**DIAMOND[0], "python_callable": "examples.etl.missing"}, *DIAMOND[1:]]}, "cannot import"),
        ({"tasks": [{**DIAMOND[0], "python_callable": "no_such_module.fn"}, *DIAMOND[1:]]}, "no module named"),
        ({"tasks": [{**DIAMOND[0], "bash_command": "echo"}, *DIAMOND[1:]]}, "exactly one of python_callable or bash_command"),
        ({"tasks": [*DIAMOND[:3], {**DIAMOND[3], "args": '{"retry_jitter": "wild"}'}]}, "retry_jitter: must be one of"),
        ({"tasks": [*DIAMOND[:3], {**DIAMOND[3], "args": '{"colour": "red"}'}]}, "Unknown key"),
        ({"default_args": '{"retries": -1}'}, "retries: must be a whole number"),
        ({"deadlines": [{"reference": "dagrun_queued_at", "interval": "-5", "callback": "notifier:log"}]}, "interval"),
        ({"deadlines": [{"reference": "fixed_datetime", "callback": "notifier:log"}]}, "required for fixed_datetime"),
        ({"deadlines": [{"reference": "dagrun_queued_at", "callback": "notifier:pager"}]}, "unknown notifier"),
        (
            {
                "deadlines": [
                    {
                        "reference": "dagrun_queued_at",
                        "callback": "notifier:webhook",
                        "callback_kwargs": '{"url": "https://evil.example/x"}',
                    }
                ]
            },
            "ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS",
        ),
        ({"deadlines": [{"reference": "dagrun_queued_at", "callback": "notifier:log", "days": "mon, someday"}]}, "someday"),
    ],
    ids=[
        "cycle",
        "unknown_upstream",
        "duplicate_task_id",
        "bad_cron",
        "bad_timezone",
        "missing_attribute",
        "missing_module",
        "callable_and_bash",
        "bad_override",
        "unknown_override",
        "negative_default_retries",
        "negative_interval",
        "fixed_without_datetime",
        "unknown_notifier",
        "webhook_host",
        "bad_day",
    ],
)
def test_it_rejects_what_import_rejects_and_saves_nothing(admin_client, change: dict, shown: str) -> None:
    """Each bad DAG is shown again with the problem on it, and nothing is written."""
    data = dag_post(**{"tasks": DIAMOND, **change})
    response = admin_client.post(ADD_URL, data)
    errors_of(response)
    assert shown in response.content.decode()
    assert Dag.objects.count() == Task.objects.count() == DeadlineDefinition.objects.count() == 0


def existing_rows(dag: Dag) -> list[dict]:
    rows = []
    for task in dag.tasks.order_by("position"):
        rows.append(
            {
                "id": str(task.pk),
                "dag": str(dag.pk),
                "task_id": task.task_id,
                "python_callable": task.python_callable,
                "bash_command": task.bash_command,
                "upstream": ", ".join(task.upstream),
                "trigger_rule": task.trigger_rule,
            }
        )
    return rows


@pytest.fixture
def pipeline(admin_client) -> Dag:
    response = admin_client.post(ADD_URL, dag_post(schedule="@daily", tasks=DIAMOND))
    assert response.status_code == 302
    return Dag.objects.get(dag_id="payments")


def test_it_rejects_deleting_a_task_others_depend_on(admin_client, pipeline) -> None:
    """Deleting `a` while `load` lists it upstream is an unknown upstream: nothing changes."""
    before = snapshot()
    rows = existing_rows(pipeline)
    rows[1]["DELETE"] = True
    response = admin_client.post(change_url(pipeline), dag_post(schedule="@daily", tasks=rows))
    assert "unknown task" in errors_of(response)
    assert snapshot() == before


def test_it_deletes_a_task_and_reorders(admin_client, pipeline) -> None:
    """Deleting a task no one depends on removes it; positions follow the rows."""
    rows = existing_rows(pipeline)
    rows[3]["DELETE"] = True
    response = admin_client.post(change_url(pipeline), dag_post(schedule="@daily", tasks=rows))
    assert response.status_code == 302, errors_of(response)
    assert list(pipeline.tasks.order_by("position").values_list("task_id", "position")) == [("extract", 0), ("a", 1), ("b", 2)]


def test_it_resets_the_next_run_when_the_schedule_changes(admin_client, pipeline) -> None:
    """Saving a new schedule clears next_run_logical_date; saving other fields keeps it."""
    next_run = datetime(2026, 11, 23, tzinfo=timezone.utc)
    Dag.objects.filter(pk=pipeline.pk).update(next_run_logical_date=next_run)
    rows = existing_rows(pipeline)

    admin_client.post(change_url(pipeline), dag_post(schedule="@daily", description="new words", tasks=rows))
    assert Dag.objects.get(pk=pipeline.pk).next_run_logical_date == next_run
    response = admin_client.post(change_url(pipeline), dag_post(schedule="@hourly", tasks=rows))
    assert response.status_code == 302, errors_of(response)
    assert Dag.objects.get(pk=pipeline.pk).next_run_logical_date is None


def test_it_shows_a_task_with_its_overrides_in_the_typed_fields(admin_client, pipeline) -> None:
    """The change page puts retries/execution_timeout/queue in their fields and the rest in JSON."""
    page = admin_client.get(change_url(pipeline)).content.decode()
    assert 'name="tasks-2-retries" value="4"' in page
    assert 'name="tasks-2-queue" value="heavy"' in page
    assert 'name="tasks-3-upstream" value="a, b"' in page


def test_it_triggers_a_run(admin_client, pipeline) -> None:
    """The trigger action creates a manual run by the acting user and audits it."""
    response = admin_client.post(LIST_URL, {"action": "trigger_run", "_selected_action": [pipeline.pk]})
    assert response.status_code == 302
    run = DagRun.objects.get(dag=pipeline)
    assert (run.run_type, run.triggered_by) == ("manual", "admin")
    assert run.task_instances.count() == 4
    entry = AuditLog.objects.get(action="trigger")  # written once, as every trigger is (orchestrator.operations.actions.trigger)
    assert (entry.action, entry.dag_id, entry.run_id, entry.username) == ("trigger", "payments", run.run_id, "admin")
    assert (entry.new_state, entry.details) == (run.state, {"conf": {}})


def test_a_paused_dags_run_is_queued_and_the_admin_says_why(admin_client, pipeline) -> None:
    """Triggering a paused DAG creates its run, which waits queued until the DAG is unpaused."""
    Dag.objects.filter(pk=pipeline.pk).update(paused=True)
    response = admin_client.post(LIST_URL, {"action": "trigger_run", "_selected_action": [pipeline.pk]}, follow=True)
    assert "is paused: the run is queued and starts once the DAG is unpaused" in response.content.decode()
    assert DagRun.objects.get().state == "queued"


def test_it_offers_trigger_only_with_the_trigger_permission(operator, pipeline) -> None:
    """A user without orchestrator.trigger_dagrun neither sees nor can use the trigger action."""
    page = operator.get(LIST_URL).content.decode()
    assert 'value="pause"' in page
    assert 'value="trigger_run"' not in page
    operator.post(LIST_URL, {"action": "trigger_run", "_selected_action": [pipeline.pk]})
    assert not DagRun.objects.exists()


def test_it_pauses_and_unpauses(admin_client, pipeline) -> None:
    """The pause and unpause actions flip the flag and are audited."""
    admin_client.post(LIST_URL, {"action": "pause", "_selected_action": [pipeline.pk]})
    assert Dag.objects.get(pk=pipeline.pk).paused is True
    admin_client.post(LIST_URL, {"action": "unpause", "_selected_action": [pipeline.pk]})
    assert Dag.objects.get(pk=pipeline.pk).paused is False
    toggles = AuditLog.objects.filter(action__in=["pause", "unpause"]).order_by("id")
    assert list(toggles.values_list("action", "new_state")) == [("pause", "paused"), ("unpause", "active")]


def test_it_requires_login(client) -> None:
    """An anonymous visitor is sent to the login page."""
    response = client.get(LIST_URL)
    assert response.status_code == 302
    assert "login" in response["Location"]
