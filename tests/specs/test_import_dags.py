"""`manage.py import_dags`: all or nothing, clear errors, updates in place."""
from __future__ import annotations

import copy
from datetime import datetime, timezone
from io import StringIO
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.core.management import CommandError, call_command

from deadlines.models import DeadlineDefinition
from orchestrator.models import Dag, DagRun, Task, TaskInstance
from tests.specs.conftest import snapshot
from tests.specs.test_schema import BAD_SPECS

pytestmark = pytest.mark.django_db

UTC = timezone.utc


@pytest.fixture(autouse=True)
def allowed_webhooks(settings) -> None:
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com"]


def import_dags(*paths: Path | str) -> str:
    out = StringIO()
    call_command("import_dags", *[str(p) for p in paths], stdout=out)
    return out.getvalue()


def rejected(*paths: Path | str) -> str:
    """Run an import that must fail; return its error message."""
    with pytest.raises(CommandError) as info:
        import_dags(*paths)
    return str(info.value)


def test_it_imports_every_field_of_the_spec_format(baseline, spec_file) -> None:
    """A DAG, its tasks, overrides and deadlines are stored as written."""
    output = import_dags(spec_file(baseline))
    assert "created settlement" in output

    dag = Dag.objects.get(dag_id="settlement")
    amsterdam = ZoneInfo("Europe/Amsterdam")
    assert (dag.description, dag.schedule, dag.timezone) == ("Nightly settlement", "0 2 * * *", "Europe/Amsterdam")
    assert dag.start_date == datetime(2026, 1, 1, tzinfo=amsterdam)
    assert (dag.catchup, dag.paused, dag.max_active_runs) == (False, False, 2)
    assert dag.default_args == baseline["default_args"]

    tasks = list(dag.tasks.order_by("position"))
    assert [(t.task_id, t.position) for t in tasks] == [("extract", 0), ("transform", 1), ("load", 2)]
    extract, transform, load = tasks
    assert extract.python_callable == "examples.etl.extract"
    assert extract.op_kwargs == {"source": "s3://bucket/x"}
    assert (transform.bash_command, transform.upstream, transform.trigger_rule) == ("echo {{ logical_date }}", ["extract"], "all_done")
    assert transform.args == {"retries": 5}
    assert extract.args == {}
    assert load.upstream == ["transform"]

    dag_deadlines = list(DeadlineDefinition.objects.filter(dag=dag, task=None).order_by("position"))
    assert [d.reference for d in dag_deadlines] == ["dagrun_queued_at", "fixed_datetime"]
    first, fixed = dag_deadlines
    assert (first.interval, first.callback, first.warn) == (3600.0, "tests.specs.callables.page", True)
    assert first.callback_kwargs == {"channel": "#data"}
    assert first.days == ["mon", "tue", "wed", "thu", "fri"]
    assert first.skip_dates == ["2026-12-25"]
    assert fixed.datetime_text == "2026-12-31T23:00:00"
    assert fixed.datetime == datetime(2026, 12, 31, 23, 0, tzinfo=amsterdam)
    task_deadline = DeadlineDefinition.objects.get(task=extract)
    assert (task_deadline.dag_id, task_deadline.reference, task_deadline.interval) == (dag.pk, "task_started_at", 600.0)


@pytest.mark.parametrize(("mutation", "path", "fragment"), [case[1:] for case in BAD_SPECS], ids=[case[0] for case in BAD_SPECS])
def test_it_rejects_bad_input_and_changes_nothing(baseline, spec_file, mutation, path: str, fragment: str) -> None:
    """Every bad input fails the command with file, DAG, field and value named; the DB is untouched."""
    import_dags(spec_file(baseline, "good.yaml"))
    before = snapshot()

    bad = copy.deepcopy(baseline)
    bad["description"] = "changed: would show up if anything were written"
    mutation(bad)
    file = spec_file(bad, "bad.yaml")
    message = rejected(file)

    dag = f"dag {bad['dag_id']!r}" if isinstance(bad.get("dag_id"), str) else "dag #1"
    lines = [line for line in message.splitlines() if line.startswith(f"{file}: {dag}: {path}")]
    assert any(fragment in line for line in lines), message
    assert snapshot() == before


def test_it_changes_nothing_when_the_second_file_is_bad(baseline, spec_file) -> None:
    """A good first file is not written when a later file of the same invocation is bad."""
    import_dags(spec_file(baseline, "settlement.yaml"))
    before = snapshot()

    changed = copy.deepcopy(baseline)
    changed["tasks"].pop()  # would delete 'load'
    new_dag = {"dag_id": "other", "tasks": [{"task_id": "a", "bash_command": "true"}]}
    broken = {"dag_id": "broken", "tasks": [{"task_id": "a", "bash_command": "true", "upstream": ["nope"]}]}
    first = spec_file([changed, new_dag], "a.yaml")
    second = spec_file(broken, "b.yaml")

    message = rejected(first, second)
    assert f"{second}: dag 'broken': tasks[0].upstream: unknown task 'nope'" in message
    assert snapshot() == before
    assert not Dag.objects.filter(dag_id="other").exists()


def test_it_names_the_file_and_line_of_invalid_yaml(spec_file) -> None:
    """A YAML syntax error names the file and the line."""
    file = spec_file("dag_id: x\ntasks:\n  - task_id: a\n   bash_command: true\n", "broken.yaml")
    message = rejected(file)
    assert f"{file}: line 4: invalid YAML" in message
    assert Dag.objects.count() == 0


def test_it_rejects_duplicate_yaml_keys(spec_file) -> None:
    """A key written twice is an error, not a silent override."""
    file = spec_file("dag_id: x\nschedule: '@daily'\nschedule: null\ntasks: []\n", "dup.yaml")
    assert f"{file}: line 3: invalid YAML: duplicate key 'schedule' (first on line 2)" in rejected(file)


def test_it_names_the_file_and_line_of_invalid_json(spec_file) -> None:
    """A JSON syntax error names the file and the line."""
    file = spec_file('{\n  "dag_id": "x",\n  "tasks": [,]\n}\n', "broken.json")
    assert f"{file}: line 3: invalid JSON" in rejected(file)


def test_it_rejects_a_missing_path_and_an_empty_file(tmp_path, spec_file) -> None:
    """A path that does not exist, or a file with no DAG in it, is an error."""
    empty = spec_file("# nothing here\n", "empty.yaml")
    message = rejected(tmp_path / "missing.yaml", empty)
    assert f"{tmp_path / 'missing.yaml'}: no such file or directory" in message
    assert f"{empty}: holds no DAG" in message


def test_it_rejects_the_same_dag_id_twice_in_one_import(baseline, spec_file) -> None:
    """Two files defining one DAG is ambiguous: rejected, naming both files."""
    first = spec_file(baseline, "a.yaml")
    second = spec_file(baseline, "b.json")
    assert f"{second}: dag 'settlement': dag_id: 'settlement' is also defined in {first}" in rejected(first, second)


def test_it_reports_every_error_in_every_file(spec_file) -> None:
    """All problems of all files are reported together, not just the first."""
    first = spec_file({"dag_id": "a", "schedule": "nope", "tasks": []}, "a.yaml")
    second = spec_file([{"dag_id": "b", "timezone": "Nowhere"}, {"dag_id": "bad id"}], "b.yaml")
    message = rejected(first, second)
    assert f"{first}: dag 'a': schedule: " in message
    assert f"{second}: dag 'b': timezone: " in message
    assert f"{second}: dag 'bad id': dag_id: " in message
    assert "3 problems" in message


def test_it_reads_a_directory_of_yaml_yml_and_json(tmp_path, spec_file) -> None:
    """A directory imports every *.yaml, *.yml and *.json in it, and nothing else."""
    spec_file({"dag_id": "a", "tasks": []}, "dags/a.yaml")
    spec_file({"dag_id": "b", "tasks": []}, "dags/b.yml")
    spec_file([{"dag_id": "c"}, {"dag_id": "d"}], "dags/c.json")
    spec_file("not a dag", "dags/notes.txt")
    output = import_dags(tmp_path / "dags")
    assert sorted(Dag.objects.values_list("dag_id", flat=True)) == ["a", "b", "c", "d"]
    assert "4 DAGs: 4 created" in output


def test_it_updates_in_place_and_keeps_history_of_dropped_tasks(baseline, spec_file) -> None:
    """Re-import updates the DAG and its tasks by id; a dropped task goes, its task instances stay."""
    import_dags(spec_file(baseline))
    dag = Dag.objects.get(dag_id="settlement")
    extract_pk = dag.tasks.get(task_id="extract").pk
    load = dag.tasks.get(task_id="load")
    now = datetime(2026, 3, 1, tzinfo=UTC)
    run = DagRun.objects.create(dag=dag, run_id="manual__1", logical_date=now, queued_at=now)
    TaskInstance.objects.create(dag_run=run, definition=load, task_id="load", state="success")

    baseline["description"] = "Settlement v2"
    baseline["tasks"] = [
        {"task_id": "report", "bash_command": "echo report", "upstream": ["extract"]},
        {**baseline["tasks"][0], "op_kwargs": {"source": "s3://bucket/y"}},
    ]
    baseline["deadlines"] = baseline["deadlines"][:1]
    output = import_dags(spec_file(baseline))

    assert "updated settlement" in output
    assert Dag.objects.get(dag_id="settlement").pk == dag.pk
    assert Dag.objects.get(pk=dag.pk).description == "Settlement v2"
    tasks = list(Task.objects.filter(dag=dag).order_by("position"))
    assert [t.task_id for t in tasks] == ["report", "extract"]
    assert tasks[1].pk == extract_pk
    assert tasks[1].op_kwargs == {"source": "s3://bucket/y"}
    instance = TaskInstance.objects.get(dag_run=run, task_id="load")
    assert instance.definition is None
    assert instance.state == "success"
    assert DeadlineDefinition.objects.filter(dag=dag, task=None).count() == 1


def test_it_reports_an_identical_reimport_as_unchanged(baseline, spec_file) -> None:
    """Importing the same file twice writes nothing the second time."""
    file = spec_file(baseline)
    import_dags(file)
    before = snapshot()
    assert "unchanged settlement" in import_dags(file)
    assert snapshot() == before


def test_it_sets_paused_only_when_the_file_says_so(baseline, spec_file) -> None:
    """`paused` in the file sets it; without it, an operator's pause is kept."""
    import_dags(spec_file({**baseline, "paused": True}))
    assert Dag.objects.get().paused is True
    import_dags(spec_file(baseline))
    assert Dag.objects.get().paused is True
    import_dags(spec_file({**baseline, "paused": False}))
    assert Dag.objects.get().paused is False


@pytest.mark.parametrize(
    ("field", "value"),
    [("schedule", "0 3 * * *"), ("timezone", "Asia/Tokyo"), ("start_date", "2026-02-01T00:00:00")],
)
def test_it_resets_the_next_run_when_the_schedule_changes(baseline, spec_file, field: str, value: str) -> None:
    """A new schedule, timezone or start_date clears next_run_logical_date for the scheduler to recompute."""
    import_dags(spec_file(baseline))
    next_run = datetime(2026, 11, 23, 1, 0, tzinfo=UTC)
    Dag.objects.update(next_run_logical_date=next_run)

    baseline["description"] = "other text"
    import_dags(spec_file(baseline))
    assert Dag.objects.get().next_run_logical_date == next_run

    baseline[field] = value
    import_dags(spec_file(baseline))
    assert Dag.objects.get().next_run_logical_date is None


def test_it_recomputes_a_fixed_deadline_when_the_timezone_changes(baseline, spec_file) -> None:
    """A naive fixed_datetime is in the DAG's timezone: a new timezone moves it."""
    import_dags(spec_file(baseline))
    baseline["timezone"] = "UTC"
    import_dags(spec_file(baseline))
    fixed = DeadlineDefinition.objects.get(reference="fixed_datetime")
    assert fixed.datetime == datetime(2026, 12, 31, 23, 0, tzinfo=UTC)


def test_it_exits_non_zero_with_the_message_on_stderr(spawn, tmp_path) -> None:
    """Run as a process, a bad import exits 1 and prints the problem."""
    file = tmp_path / "bad.yaml"
    file.write_text("dag_id: settlement\ntasks:\n  - task_id: a\n    bash_command: 'true'\n    upstream: [nope]\n")
    proc = spawn("import_dags", str(file))
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert f"{file}: dag 'settlement': tasks[0].upstream: unknown task 'nope'" in output
