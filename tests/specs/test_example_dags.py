"""The example DAGs in `dags/` import cleanly and their callables behave as described."""
from __future__ import annotations

from datetime import datetime, timezone
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from examples import etl, flaky
from orchestrator.engine.run_creation import create_run
from orchestrator.engine.scheduler import schedule_once
from orchestrator.models import Dag, DagRun, TaskInstance
from tests.conftest import wait_until


def context(**overrides: object) -> dict[str, object]:
    return {
        "dag_id": "example",
        "task_id": "t",
        "run_id": "manual__2026-01-01T00:00:00+00:00",
        "try_number": 1,
        "infrastructure_try_number": 0,
        "logical_date": "2026-01-01T00:00:00+00:00",
        "conf": {},
        **overrides,
    }


@pytest.mark.django_db
def test_it_imports_the_example_dags() -> None:
    """`dags/` holds the ETL diamond, the bash DAG and the flaky DAG with a log deadline."""
    out, err = StringIO(), StringIO()
    call_command("import_dags", "dags", stdout=out, stderr=err)
    # A first run shows DAGs that fit their deadlines: no retry-budget warning.
    assert "warning:" not in out.getvalue() + err.getvalue()
    assert set(Dag.objects.values_list("dag_id", flat=True)) >= {"example_etl", "example_bash", "example_flaky"}
    etl_dag = Dag.objects.get(dag_id="example_etl")
    assert etl_dag.schedule == "@daily"
    upstreams = {task.task_id: task.upstream for task in etl_dag.tasks.all()}
    assert upstreams == {
        "extract": [],
        "transform_a": ["extract"],
        "transform_b": ["extract"],
        "load": ["transform_a", "transform_b"],
    }
    flaky_task = Dag.objects.get(dag_id="example_flaky").tasks.get(task_id="flaky")
    assert [d.callback for d in flaky_task.deadline_definitions.all()] == ["notifier:log"]


def test_it_fails_the_flaky_task_on_its_first_try_only() -> None:
    """The flaky callable raises on try 1 and succeeds on try 2."""
    with pytest.raises(RuntimeError):
        flaky.fail_first_try(context=context(try_number=1))
    assert flaky.fail_first_try(context=context(try_number=2)) == "ok"


def test_it_runs_the_etl_steps_with_their_op_kwargs(capsys) -> None:
    """Each ETL step takes its op_kwargs plus the context and returns a JSON-able summary."""
    assert etl.extract(source="memory://orders", context=context()) == {"rows": 3}
    assert etl.transform_a(context=context()) == {"EUR": 200.5, "USD": 42.0}
    assert etl.transform_b(min_amount=50, context=context()) == {"large_orders": [1, 2]}
    assert etl.load(target="warehouse", context=context())["key"] == "example/manual__2026-01-01T00:00:00+00:00"
    assert "extracting 3 orders" in capsys.readouterr().out


def test_the_mapping_example_lists_loads_and_summarises() -> None:
    """example_mapping: a list result, one load per item, the list of results summarised."""
    from examples import mapping

    paths = mapping.list_files(prefix="s3://x", count=2, context=context())
    assert paths == ["s3://x/2026-01-01/part-000.csv", "s3://x/2026-01-01/part-001.csv"]
    loaded = [mapping.load_file(path, context=context(map_index=i)) for i, path in enumerate(paths)]
    assert mapping.summarise(context=context(results={"load_file": loaded})) == {"files": 2, "rows": 207}


@pytest.mark.django_db
def test_the_waits_example_holds_each_kind_and_warns_only_of_its_upstream_dag_when_alone() -> None:
    """example_waits waits on a time, example_etl's run, an event and an approval; imported with
    the other examples it is clean, imported alone its dag_run on example_etl is the one warning."""
    out, err = StringIO(), StringIO()
    call_command("import_dags", "dags/example_waits.yaml", stdout=out, stderr=err)
    warnings = [line for line in (out.getvalue() + err.getvalue()).splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert "'etl_done'" in warnings[0]
    assert "'example_etl' is not defined (yet)" in warnings[0]
    kinds = {task.task_id: next(iter(task.wait_for)) for task in Dag.objects.get(dag_id="example_waits").tasks.exclude(wait_for=None)}
    assert kinds == {"settle": "time_after_logical_date", "etl_done": "dag_run", "orders_landed": "event", "publish_ok": "approval"}

    out, err = StringIO(), StringIO()
    call_command("import_dags", "dags", stdout=out, stderr=err)
    assert "warning:" not in out.getvalue() + err.getvalue()


@pytest.mark.django_db(transaction=True)
def test_the_waits_example_completes_as_its_walk_through_says(client) -> None:
    """The walk-through in the DAG file: example_etl's run of the same logical date, the event
    by `send_event`, the approval on the task page; then publish is ready to run."""
    call_command("import_dags", "dags", stdout=StringIO())
    logical = datetime(2026, 6, 1, tzinfo=timezone.utc)
    etl = create_run(Dag.objects.get(dag_id="example_etl"), run_type=DagRun.RunType.MANUAL, logical_date=logical, now=logical)
    TaskInstance.objects.filter(dag_run=etl, task_id="load").update(state="success")
    run = create_run(Dag.objects.get(dag_id="example_waits"), run_type=DagRun.RunType.MANUAL, logical_date=logical, now=logical)

    def states() -> dict[str, str]:
        schedule_once()
        return dict(TaskInstance.objects.filter(dag_run=run).values_list("task_id", "state"))

    wait_until(lambda: states()["etl_done"] == states()["settle"] == "success", timeout=20, message="the time and dag_run waits")
    assert states()["orders_landed"] == "up_for_reschedule"
    assert states()["publish"] == "none"

    events = StringIO()
    call_command("send_event", "orders_landed", "--payload", '{"rows": 3}', stdout=events)
    assert "example_waits" in events.getvalue()
    wait_until(lambda: states()["publish_ok"] == "up_for_reschedule", timeout=20, message="the approval's wait")
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", password=None))
    page = f"/dags/example_waits/runs/{run.run_id}/tasks/publish_ok"
    assert "Publish the order report?" in client.get(page).content.decode()
    assert client.post(f"{page}/approve", {"note": "numbers look right"}).status_code == 302
    wait_until(lambda: states()["publish"] not in ("none", "up_for_reschedule"), timeout=20, message="publish to be ready")
    published = TaskInstance.objects.get(dag_run=run, task_id="publish")
    assert published.state in ("scheduled", "queued"), published.state
    assert TaskInstance.objects.get(dag_run=run, task_id="publish_ok").result == {"approved_by": "admin", "note": "numbers look right"}
