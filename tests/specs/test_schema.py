"""The pure validator: every rule, with the field and the bad value named."""
from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from orchestrator.specs.schema import validate_dag

Mutation = Callable[[dict[str, Any]], None]


def setter(*path: Any, value: Any) -> Mutation:
    """A mutation that sets spec[path...] = value."""

    def mutate(spec: dict[str, Any]) -> None:
        target = spec
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def deleter(*path: Any) -> Mutation:
    def mutate(spec: dict[str, Any]) -> None:
        target = spec
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


def both(*mutations: Mutation) -> Mutation:
    def mutate(spec: dict[str, Any]) -> None:
        for mutation in mutations:
            mutation(spec)

    return mutate


# (id, mutation of the baseline, field path named in the problem, text the message must contain)
BAD_SPECS: list[tuple[str, Mutation, str, str]] = [
    ("dag_id_pattern", setter("dag_id", value="bad id!"), "dag_id", "'bad id!'"),
    ("dag_id_too_long", setter("dag_id", value="x" * 251), "dag_id", "must be 1-250"),
    ("task_id_pattern", setter("tasks", 0, "task_id", value="no/slash"), "tasks[0].task_id", "'no/slash'"),
    ("cycle", setter("tasks", 0, "upstream", value=["load"]), "tasks[", "cycle: "),
    ("self_upstream", setter("tasks", 0, "upstream", value=["extract"]), "tasks[0].upstream", "own upstream"),
    ("unknown_upstream", setter("tasks", 1, "upstream", value=["extract", "nope"]), "tasks[1].upstream", "unknown task 'nope'"),
    ("duplicate_task_id", setter("tasks", 2, "task_id", value="extract"), "tasks[2].task_id", "duplicate task id 'extract'"),
    (
        "both_callable_and_bash",
        setter("tasks", 1, "python_callable", value="examples.etl.load"),
        "tasks[1]",
        "exactly one of python_callable or bash_command",
    ),
    ("neither_callable_nor_bash", deleter("tasks", 1, "bash_command"), "tasks[1]", "set one of python_callable or bash_command"),
    ("missing_module", setter("tasks", 0, "python_callable", value="no_such_pkg.mod.fn"), "tasks[0].python_callable", "no_such_pkg"),
    ("missing_attribute", setter("tasks", 0, "python_callable", value="examples.etl.nope"), "tasks[0].python_callable", "'nope'"),
    ("not_dotted", setter("tasks", 0, "python_callable", value="extract"), "tasks[0].python_callable", "dotted path"),
    (
        "not_callable",
        setter("tasks", 0, "python_callable", value="tests.specs.callables.NOT_CALLABLE"),
        "tasks[0].python_callable",
        "not callable",
    ),
    (
        "class_without_execute",
        setter("tasks", 2, "python_callable", value="tests.specs.callables.NotAnOperator"),
        "tasks[2].python_callable",
        "no execute()",
    ),
    ("bad_cron", setter("schedule", value="61 * * * *"), "schedule", "'61 * * * *'"),
    ("cron_with_seconds", setter("schedule", value="0 0 2 * * *"), "schedule", "'0 0 2 * * *'"),
    ("unknown_preset", setter("schedule", value="@fortnightly"), "schedule", "'@fortnightly'"),
    ("unknown_timezone", setter("timezone", value="Mars/Olympus_Mons"), "timezone", "'Mars/Olympus_Mons'"),
    # longer than a file name may be: the zone database's lookup fails with an OSError
    ("timezone_too_long", setter("timezone", value="a" * 300), "timezone", "unknown timezone"),
    ("negative_retries", setter("default_args", "retries", value=-1), "default_args.retries", "-1"),
    ("fractional_retries", setter("default_args", "retries", value=1.5), "default_args.retries", "1.5"),
    ("negative_retry_delay", setter("tasks", 1, "retry_delay", value=-2), "tasks[1].retry_delay", "-2"),
    ("negative_retry_max_delay", setter("default_args", "retry_max_delay", value=-1), "default_args.retry_max_delay", "-1"),
    ("negative_execution_timeout", setter("tasks", 0, "execution_timeout", value=-5), "tasks[0].execution_timeout", "-5"),
    ("negative_kill_grace", setter("default_args", "kill_grace", value=-0.5), "default_args.kill_grace", "-0.5"),
    (
        "negative_infrastructure_retry_limit",
        setter("default_args", "infrastructure_retry_limit", value=-3),
        "default_args.infrastructure_retry_limit",
        "-3",
    ),
    ("negative_poison_threshold", setter("tasks", 2, "poison_threshold", value=-1), "tasks[2].poison_threshold", "-1"),
    ("retries_as_text", setter("default_args", "retries", value="3"), "default_args.retries", "'3'"),
    ("retry_backoff", setter("default_args", "retry_backoff", value="linear"), "default_args.retry_backoff", "'linear'"),
    ("retry_jitter", setter("tasks", 0, "retry_jitter", value="some"), "tasks[0].retry_jitter", "'some'"),
    ("queue_name", setter("default_args", "queue", value="has space"), "default_args.queue", "'has space'"),
    ("trigger_rule", setter("tasks", 1, "trigger_rule", value="sometimes"), "tasks[1].trigger_rule", "'sometimes'"),
    ("unknown_default_arg", setter("default_args", "retires", value=3), "default_args.retires", "did you mean 'retries'"),
    ("unknown_task_key", setter("tasks", 0, "colour", value="red"), "tasks[0].colour", "unknown key"),
    ("unknown_dag_key", setter("colour", value="me"), "colour", "unknown key"),
    ("owner_not_a_name", setter("owner", value="data team"), "owner", "'data team'"),
    ("max_active_runs_zero", setter("max_active_runs", value=0), "max_active_runs", "0"),
    ("start_date", setter("start_date", value="next tuesday"), "start_date", "'next tuesday'"),
    ("catchup_not_bool", setter("catchup", value="no"), "catchup", "'no'"),
    ("paused_not_bool", setter("paused", value=1), "paused", "1"),
    ("op_kwargs_list", setter("tasks", 0, "op_kwargs", value=["a"]), "tasks[0].op_kwargs", "must be a mapping"),
    ("op_kwargs_context", setter("tasks", 0, "op_kwargs", value={"context": 1}), "tasks[0].op_kwargs.context", "reserved"),
    ("upstream_not_list", setter("tasks", 1, "upstream", value="extract"), "tasks[1].upstream", "'extract'"),
    ("tasks_not_list", setter("tasks", value={"a": 1}), "tasks", "must be a list"),
    ("default_args_not_mapping", setter("default_args", value=[1]), "default_args", "must be a mapping"),
    ("dag_reference_unknown", setter("deadlines", 0, "reference", value="tomorrow"), "deadlines[0].reference", "'tomorrow'"),
    (
        "task_reference_on_dag",
        setter("deadlines", 0, "reference", value="task_started_at"),
        "deadlines[0].reference",
        "'task_started_at'",
    ),
    (
        "dag_reference_on_task",
        setter("tasks", 0, "deadlines", 0, "reference", value="dagrun_queued_at"),
        "tasks[0].deadlines[0].reference",
        "'dagrun_queued_at'",
    ),
    ("negative_interval", setter("deadlines", 0, "interval", value=-60), "deadlines[0].interval", "-60"),
    ("fixed_without_datetime", deleter("deadlines", 1, "datetime"), "deadlines[1].datetime", "required for fixed_datetime"),
    ("fixed_bad_datetime", setter("deadlines", 1, "datetime", value="31/12/2026"), "deadlines[1].datetime", "'31/12/2026'"),
    ("datetime_without_fixed", setter("deadlines", 0, "datetime", value="2026-01-01"), "deadlines[0].datetime", "only for"),
    ("callback_unimportable", setter("deadlines", 0, "callback", value="myteam.alerts.page"), "deadlines[0].callback", "'myteam"),
    (
        "callback_not_callable",
        setter("deadlines", 0, "callback", value="tests.specs.callables.NOT_CALLABLE"),
        "deadlines[0].callback",
        "not callable",
    ),
    ("unknown_notifier", setter("deadlines", 0, "callback", value="notifier:sms"), "deadlines[0].callback", "'sms'"),
    (
        "webhook_without_url",
        setter("deadlines", 0, "callback", value="notifier:webhook"),
        "deadlines[0].callback_kwargs.url",
        "needs callback_kwargs.url",
    ),
    (
        "webhook_host_not_allowed",
        both(
            setter("deadlines", 0, "callback", value="notifier:webhook"),
            setter("deadlines", 0, "callback_kwargs", value={"url": "https://evil.example.net/hook"}),
        ),
        "deadlines[0].callback_kwargs.url",
        "'evil.example.net'",
    ),
    (
        "webhook_not_http",
        both(
            setter("deadlines", 0, "callback", value="notifier:webhook"),
            setter("deadlines", 0, "callback_kwargs", value={"url": "file:///etc/passwd"}),
        ),
        "deadlines[0].callback_kwargs.url",
        "http(s) URL",
    ),
    (
        "notifier_keyword_typo",
        setter("deadlines", 1, "callback_kwargs", value={"levle": "info"}),
        "deadlines[1].callback_kwargs.levle",
        "not taken by notifier:log",
    ),
    ("callback_kwargs_not_mapping", setter("deadlines", 0, "callback_kwargs", value="x"), "deadlines[0].callback_kwargs", "'x'"),
    ("warn_not_bool", setter("deadlines", 0, "warn", value="yes"), "deadlines[0].warn", "'yes'"),
    ("unknown_day", setter("deadlines", 0, "days", value=["mon", "funday"]), "deadlines[0].days[1]", "'funday'"),
    ("bad_skip_date", setter("deadlines", 0, "skip_dates", value=["2026-02-30"]), "deadlines[0].skip_dates[0]", "'2026-02-30'"),
    ("unknown_deadline_key", setter("tasks", 0, "deadlines", 0, "at", value=1), "tasks[0].deadlines[0].at", "unknown key"),
]


@pytest.fixture(autouse=True)
def allowed_webhooks(settings) -> None:
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com"]


def test_it_accepts_the_full_documented_example(baseline) -> None:
    """A spec using every documented field validates cleanly into the normalised form."""
    spec, problems = validate_dag(baseline)
    assert problems == []
    amsterdam = ZoneInfo("Europe/Amsterdam")
    assert spec["start_date"] == datetime(2026, 1, 1, tzinfo=amsterdam)
    assert spec["paused"] is None  # not given: an import keeps the stored value
    assert spec["tasks"][1]["args"] == {"retries": 5}
    assert spec["tasks"][1]["upstream"] == ["extract"]
    fixed = spec["deadlines"][1]
    assert fixed["datetime"] == datetime(2026, 12, 31, 23, 0, tzinfo=amsterdam)
    assert fixed["datetime_text"] == "2026-12-31T23:00:00"


@pytest.mark.parametrize(("mutation", "path", "fragment"), [case[1:] for case in BAD_SPECS], ids=[case[0] for case in BAD_SPECS])
def test_it_rejects_bad_input_naming_field_and_value(baseline, mutation: Mutation, path: str, fragment: str) -> None:
    """Each broken rule yields a problem on the field that breaks it, quoting the bad value."""
    mutation(baseline)
    _, problems = validate_dag(baseline)
    messages = [str(problem) for problem in problems]
    assert any(message.startswith(path) and fragment in message for message in messages), messages


def test_it_reports_every_problem_not_just_the_first(baseline) -> None:
    """Several mistakes in one spec are all reported."""
    baseline["schedule"] = "bad"
    baseline["timezone"] = "Nowhere/Town"
    baseline["tasks"][1]["upstream"] = ["ghost"]
    _, problems = validate_dag(baseline)
    assert {problem.path for problem in problems} == {"schedule", "timezone", "tasks[1].upstream"}


def test_it_names_the_tasks_of_a_cycle_in_running_order(baseline) -> None:
    """A cycle is shown as the path that loops back: extract -> transform -> load -> extract."""
    baseline["tasks"][0]["upstream"] = ["load"]
    _, problems = validate_dag(baseline)
    cycles = [problem.message for problem in problems if "cycle" in problem.message]
    assert cycles == ["cycle: extract -> transform -> load -> extract"]


@pytest.mark.parametrize("schedule", [None, "@hourly", "@daily", "@weekly", "@monthly", "@yearly", "*/5 * * * 1-5"])
def test_it_accepts_cron_presets_and_null(baseline, schedule: str | None) -> None:
    """A schedule may be a 5-field cron, a preset, or null (manual only)."""
    baseline["schedule"] = schedule
    assert validate_dag(baseline)[1] == []


def test_it_accepts_a_webhook_to_an_allowed_host(baseline) -> None:
    """notifier:webhook passes when its URL's host is in ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS."""
    baseline["deadlines"][0]["callback"] = "notifier:webhook"
    baseline["deadlines"][0]["callback_kwargs"] = {"url": "https://Hooks.Example.com/x"}
    assert validate_dag(baseline)[1] == []


def test_it_reads_an_aware_datetime_as_written(baseline) -> None:
    """A date-time with an offset keeps it; a naive one is in the DAG's timezone."""
    baseline["deadlines"][1]["datetime"] = "2026-12-31T23:00:00+00:00"
    spec, problems = validate_dag(baseline)
    assert problems == []
    assert spec["deadlines"][1]["datetime"] == datetime(2026, 12, 31, 23, 0, tzinfo=ZoneInfo("UTC"))


def test_it_allows_an_explicit_null_execution_timeout(baseline) -> None:
    """execution_timeout: null means no timeout, and a task may set it to override the DAG's."""
    baseline["tasks"][0]["execution_timeout"] = None
    spec, problems = validate_dag(baseline)
    assert problems == []
    assert spec["tasks"][0]["args"] == {"execution_timeout": None}


def test_it_names_a_nul_character_anywhere_in_the_spec(baseline) -> None:
    """PostgreSQL cannot store NUL: the import refuses it with the field named, before any write."""
    from orchestrator.specs.schema import validate_dag

    baseline["description"] = "night\x00ly"
    baseline["tasks"][0]["op_kwargs"] = {"source": "s3://x\x00"}
    _, problems = validate_dag(baseline)
    where = {str(p) for p in problems}
    assert any("description" in w and "NUL" in w for w in where), where
    assert any("tasks[0].op_kwargs.source" in w for w in where), where


def test_it_names_a_lone_surrogate_anywhere_in_the_spec(baseline) -> None:
    """A JSON spec's "\\udcff" escape is a lone surrogate: refused like NUL, the field named."""
    baseline["tasks"][0]["op_kwargs"] = {"source": "s3://x\udcff"}
    _, problems = validate_dag(baseline)
    assert [p.path for p in problems] == ["tasks[0].op_kwargs.source"]
    assert "lone surrogate" in problems[0].message
