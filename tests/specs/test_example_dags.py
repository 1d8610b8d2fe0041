"""The example DAGs in `dags/` import cleanly and their callables behave as described."""
from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from examples import etl, flaky
from orchestrator.models import Dag


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
