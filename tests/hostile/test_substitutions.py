"""Hostile values in bash templates, through real workers: whatever a conf value, an upstream's
result or a mapped item holds (quotes, `;`, `$(...)`, backticks, a newline, a glob, `$HOME`,
nothing), the command gets it as text: bare it is one word, inside double quotes its part of
the text, and nothing of it runs. A value the command cannot be given fails its attempt as the
task's own startup error; a template inside single quotes is refused at import."""
from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command
from django.db import connection

from orchestrator.engine.scheduler import schedule_once
from orchestrator.foundation.results import last_line
from orchestrator.models import Dag, DagRun, TaskInstance
from tests.conftest import wait_until
from tests.worker.conftest import make_dag, queue_name, scheduler_settings, trigger, worker  # noqa: F401  fixtures

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

GIVEN = "tests.hostile.substitution_tasks.given"
# A failpoint in every task's own process: bash is then exec'ed by a forked task process instead
# of being started directly by the fork server. Both ways must hand bash the same values.
PATHS = {"direct": {}, "forked": {"ORCHESTRATOR_FAILPOINTS": "task.after_running=sleep:0"}}


def hostile(marker: Path) -> list[str]:
    """Values that would create `marker` (or not be one word) if pasted into a command."""
    f = str(marker)
    return [f"'; touch {f}; '", f'"; touch {f}; "', f"$(touch {f})", f"`touch {f}`", f"\ntouch {f}", "*", "$HOME", "", "{{ dag_id }}"]


def finished(run: DagRun, timeout: float = 120.0) -> DagRun:
    def done() -> DagRun | None:
        schedule_once()
        current = DagRun.objects.get(pk=run.pk)
        return current if current.state in ("success", "failed") else None

    return wait_until(done, timeout=timeout, interval=0.1, message="the run to finish")


def outputs(run: DagRun, task_id: str) -> list[tuple[str, object]]:
    """(stdout, result) of each instance of a task, in map_index order."""
    tis = TaskInstance.objects.filter(dag_run=run, task_id=task_id).order_by("map_index")
    found = []
    for ti in tis:
        assert ti.state == "success", (task_id, ti.map_index, ti.state, ti.last_failure_context)
        found.append((ti.attempts.get().stdout, ti.result))
    return found


def printed(text: str) -> tuple[str, object]:
    """What a bash task that printed `text` shows: its output, and its result (the last line)."""
    return text, last_line(text)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_hostile_values_reach_the_command_as_text_through_conf_results_and_mapped_items(path, worker, make_dag, tmp_path):  # noqa: F811
    marker = tmp_path / "pwned"
    values = hostile(marker)
    keys = [f"k{i}" for i in range(len(values))]
    by_key = dict(zip(keys, values))

    def bare(template: str) -> str:
        return "printf '<%s>' " + " ".join(template.format(key=key) for key in keys)

    def quoted(template: str) -> str:
        return "printf '<%s>' " + " ".join('"a' + template.format(key=key) + 'b"' for key in keys)

    dag = make_dag([
        {"task_id": "values", "python_callable": GIVEN, "op_kwargs": {"value": by_key}},
        {"task_id": "items", "python_callable": GIVEN, "op_kwargs": {"value": values}},
        {"task_id": "conf_bare", "bash_command": bare("{{{{ conf.{key} }}}}")},
        {"task_id": "conf_quoted", "bash_command": quoted("{{{{ conf.{key} }}}}")},
        {"task_id": "params_bare", "bash_command": bare("{{{{ params.{key} }}}}")},
        {"task_id": "params_quoted", "bash_command": quoted("{{{{ params.{key} }}}}")},
        {"task_id": "results_bare", "bash_command": bare("{{{{ results.values.{key} }}}}"), "upstream": ["values"]},
        {"task_id": "results_quoted", "bash_command": quoted("{{{{ results.values.{key} }}}}"), "upstream": ["values"]},
        {"task_id": "results_whole", "bash_command": "printf '<%s>' {{ results.items }} \"{{ results.values }}\"", "upstream": ["values", "items"]},
        {"task_id": "mapped_bare", "bash_command": "printf '<%s>' {{ item }}", "upstream": ["items"], "expand": {"item": "results.items"}},
        {"task_id": "mapped_quoted", "bash_command": "printf '<%s>' \"a{{ item }}b\"", "upstream": ["items"], "expand": {"item": "results.items"}},
    ], retries=0)
    # Declared params: half of them given in the conf, the others filled from their defaults.
    given = dict(list(by_key.items())[::2])
    Dag.objects.filter(pk=dag.pk).update(params={key: {"type": "string", "default": value} for key, value in by_key.items()})
    dag.refresh_from_db()
    worker(**PATHS[path])
    run = finished(trigger(dag, conf=given))  # the run's conf is the filled one: conf.KEY sees every value
    assert run.state == "success", [(ti.task_id, ti.state, ti.last_failure_context) for ti in TaskInstance.objects.filter(dag_run=run)]

    one_word_each = "".join(f"<{value}>" for value in values)
    part_of_the_text = "".join(f"<a{value}b>" for value in values)
    assert outputs(run, "conf_bare") == outputs(run, "results_bare") == outputs(run, "params_bare") == [printed(one_word_each)]
    assert outputs(run, "conf_quoted") == outputs(run, "results_quoted") == outputs(run, "params_quoted") == [printed(part_of_the_text)]
    compact = json.dumps(values, ensure_ascii=False, separators=(",", ":")), json.dumps(by_key, ensure_ascii=False, separators=(",", ":"))
    assert outputs(run, "results_whole") == [printed(f"<{compact[0]}><{compact[1]}>")]
    assert outputs(run, "mapped_bare") == [printed(f"<{value}>") for value in values]
    assert outputs(run, "mapped_quoted") == [printed(f"<a{value}b>") for value in values]
    assert not marker.exists()


def test_a_command_that_cannot_be_given_its_values_fails_as_the_tasks_startup_error(worker, make_dag):  # noqa: F811
    """A template in single quotes stored before the import refused it, a value too large for an
    environment variable and (where the database stores one: SQLite; a trigger refuses it, so it
    is written into the run's conf here) a NUL: nothing starts, the attempt is the task's
    `application/startup_error` at once, and the worker carries on."""
    failing = {
        "quoted": ("echo 'team {{ conf.team }}'", "{{ conf.team }} is inside single quotes"),
        "huge": ("echo {{ conf.huge }}", "{{ conf.huge }} is 200"),
    }
    conf = {"team": "data", "huge": "x" * 200_000}
    if connection.vendor == "sqlite":  # PostgreSQL's jsonb refuses a NUL: no conf can hold one there
        failing["nul"] = ("echo {{ conf.nul }}", "{{ conf.nul }} holds a NUL character")
        conf["nul"] = "to be replaced"
    dag = make_dag([
        *({"task_id": task_id, "bash_command": command} for task_id, (command, _) in failing.items()),
        {"task_id": "after", "bash_command": 'echo "after {{ conf.team }}"', "upstream": list(failing), "trigger_rule": "all_done"},
    ], retries=1)
    run = trigger(dag, conf=conf)
    if "nul" in conf:
        DagRun.objects.filter(pk=run.pk).update(conf={**conf, "nul": "a\x00b"})
    proc = worker()
    run = finished(run)
    for task_id, (_, says) in failing.items():
        ti = TaskInstance.objects.get(dag_run=run, task_id=task_id)
        assert (ti.state, ti.try_number, ti.infrastructure_try_number) == ("failed", 2, 0), task_id
        for attempt in ti.attempts.order_by("id"):
            assert attempt.kind == "user"
            assert attempt.start_date is None
            assert (attempt.context["category"], attempt.context["reason"]) == ("application", "startup_error")
            assert says in attempt.context["metadata"]["error"], attempt.context
    after = TaskInstance.objects.get(dag_run=run, task_id="after")
    assert (after.state, after.result) == ("success", "after data")
    assert proc.poll() is None  # the worker is still there
    assert not any("Traceback" in line for line in proc.log_lines), "".join(proc.log_lines)


def test_a_template_inside_single_quotes_is_an_import_error_naming_file_dag_task_and_field(tmp_path):
    spec = {
        "dag_id": "quoted_templates",
        "tasks": [
            {"task_id": "fine", "bash_command": 'echo "team {{ conf.team }}" {{ conf.team }}'},
            {"task_id": "words", "bash_command": "echo 'over {{ item }}'", "expand": {"item": ["a", "b"]}},
        ],
    }
    path = tmp_path / "quoted.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(CommandError) as raised:
        call_command("import_dags", str(path), stdout=StringIO())
    message = str(raised.value)
    assert str(path) in message, message
    assert "quoted_templates" in message, message
    assert "tasks[1].bash_command: task 'words': {{ item }} is inside single quotes" in message, message
    assert "tasks[0]" not in message, message
    assert not Dag.objects.filter(dag_id="quoted_templates").exists()
