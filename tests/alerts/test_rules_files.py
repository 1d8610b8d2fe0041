"""import_alert_rules and export_alert_rules: all or nothing, errors naming file, rule and field,
secrets masked, export -> import a no-op; the admin's form with the same checks."""
from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from alerts import masking
from alerts.admin import AlertRuleForm
from alerts.models import AlertRule

pytestmark = pytest.mark.django_db

URL = "https://hooks.example/T0/B0/xyzSECRET"
RULES = [
    {
        "name": "platform-oncall",
        "when": "task_failed",
        "category": ["infrastructure"],
        "reason": ["worker_lost", "resource_exhaustion"],
        "dag_id": ["payments.*"],
        "task_id": [],
        "owner": ["platform"],
        "notify": "notifier:webhook",
        "notify_kwargs": {"url": URL, "format": "slack", "headers": {"X-Api-Token": "tok-123"}},
        "group_by": ["category", "reason"],
        "repeat_after": 3600,
        "resolve": True,
    },
    {"name": "data-team", "when": "task_dead_lettered", "notify": "notifier:log"},
]


@pytest.fixture(autouse=True)
def allowed(settings) -> None:
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["hooks.example"]


def write(tmp_path: Path, rules: object, name: str = "rules.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return str(path)


def export(*flags: str) -> str:
    out = io.StringIO()
    call_command("export_alert_rules", *flags, stdout=out)
    return out.getvalue()


def test_it_imports_every_field_and_export_then_import_changes_nothing(tmp_path):
    call_command("import_alert_rules", write(tmp_path, RULES), stdout=io.StringIO())
    stored = AlertRule.objects.get(name="platform-oncall")
    assert stored.notify_kwargs["url"] == URL
    assert stored.repeat_after == 3600
    assert stored.resolve
    masked = export()
    assert "xyzSECRET" not in masked
    assert "tok-123" not in masked
    assert "https://hooks.example/****" in masked
    out = io.StringIO()
    call_command("import_alert_rules", write(tmp_path, yaml.safe_load(masked), "again.yaml"), stdout=out)
    assert "2 rules: 0 created, 0 updated, 2 unchanged" in out.getvalue()
    assert AlertRule.objects.get(name="platform-oncall").notify_kwargs == RULES[0]["notify_kwargs"]


def test_include_secrets_exports_them_in_full(tmp_path):
    call_command("import_alert_rules", write(tmp_path, RULES), stdout=io.StringIO())
    full = yaml.safe_load(export("--include-secrets"))
    assert full[1] == {**RULES[0], "notify_kwargs": RULES[0]["notify_kwargs"]}
    assert full[0]["name"] == "data-team"


def test_errors_name_the_file_the_rule_and_the_field_and_nothing_is_written(tmp_path):
    bad = [
        {**RULES[0], "notify_kwargs": {"url": "https://evil.example/hook/abc"}},
        {"name": "x", "when": "sometimes", "notify": "notifier:log", "group_by": ["colour"]},
    ]
    path = write(tmp_path, [RULES[1], *bad])
    with pytest.raises(CommandError) as raised:
        call_command("import_alert_rules", path, stdout=io.StringIO())
    message = str(raised.value)
    assert f"{path}: rule 'platform-oncall': notify_kwargs.url: webhook host 'evil.example' is not in ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS" in message
    assert f"{path}: rule 'x': when:" in message
    assert f"{path}: rule 'x': group_by: unknown value 'colour'" in message
    assert "/hook/abc" not in message  # the host, never the URL
    assert not AlertRule.objects.exists()


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("name", "no spaces", "name: must be"),
        ("category", ["cosmic"], "category: unknown value 'cosmic'"),
        ("reason", "worker_lost", None),  # one value stands for a list of one
        ("owner", ["a b"], "owner: 'a b' is no owner"),
        ("notify", "no.such.module.fn", "notify: cannot import"),
        ("notify", "notifier:pager", "notify: unknown notifier 'pager'"),
        ("repeat_after", 0, "repeat_after: must be a number of seconds > 0"),
        ("resolve", "yes", "resolve: must be true or false"),
        ("colour", 1, "colour: unknown field"),
    ],
)
def test_each_field_is_checked(tmp_path, field, value, expected):
    path = write(tmp_path, [{**RULES[1], field: value}])
    if expected is None:
        call_command("import_alert_rules", path, stdout=io.StringIO())
        assert AlertRule.objects.get(name="data-team").reason == ["worker_lost"]
        return
    with pytest.raises(CommandError, match="rule '(data-team|no spaces)': " + expected.replace("(", r"\(")):
        call_command("import_alert_rules", path, stdout=io.StringIO())


def test_a_duplicate_name_and_a_file_that_is_not_there_are_errors(tmp_path):
    with pytest.raises(CommandError, match="names this rule twice"):
        call_command("import_alert_rules", write(tmp_path, [RULES[1], RULES[1]]), stdout=io.StringIO())
    with pytest.raises(CommandError, match="nope.yaml: cannot read"):
        call_command("import_alert_rules", str(tmp_path / "nope.yaml"), stdout=io.StringIO())


def test_a_masked_value_with_nothing_stored_is_an_error(tmp_path):
    rules = [{**RULES[0], "notify_kwargs": {"url": "https://hooks.example/****"}}]
    with pytest.raises(CommandError, match=r"notify_kwargs.url: is masked, and there is no stored value"):
        call_command("import_alert_rules", write(tmp_path, rules), stdout=io.StringIO())


def test_json_files_import_too(tmp_path):
    import json

    path = tmp_path / "rules.json"
    path.write_text(json.dumps(RULES))
    call_command("import_alert_rules", str(path), stdout=io.StringIO())
    assert AlertRule.objects.count() == 2


def test_masking_hides_paths_queries_and_secret_names():
    shown = masking.mask({"url": "https://u:p@hooks.example:8443/a/b?token=1", "api_key": "k", "channel": "#ops", "retries": 3, "plain": "https://x.example"})
    assert shown == {"url": "https://hooks.example:8443/****", "api_key": "****", "channel": "#ops", "retries": 3, "plain": "https://x.example"}


def test_the_admin_form_validates_alike_and_shows_secrets_masked(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    call_command("import_alert_rules", write(tmp_path, RULES), stdout=io.StringIO())
    stored = AlertRule.objects.get(name="platform-oncall")
    form = AlertRuleForm(instance=stored)
    assert "xyzSECRET" not in form.as_p()
    assert "tok-123" not in form.as_p()
    data = {key: form.initial.get(key) for key in form.fields}
    import json

    posted = {k: json.dumps(v) if isinstance(v, list | dict) else ("" if v is None else v) for k, v in data.items()}
    posted["resolve"] = "on"
    kept = AlertRuleForm(posted, instance=stored)
    assert kept.is_valid(), kept.errors
    assert kept.cleaned_data["notify_kwargs"]["url"] == URL  # the masked value kept the stored one
    posted["notify_kwargs"] = json.dumps({"url": "https://evil.example/x"})
    refused = AlertRuleForm(posted, instance=stored)
    assert not refused.is_valid()
    assert "evil.example" in str(refused.errors["notify_kwargs"])
    assert not any("xyzSECRET" in record.getMessage() for record in caplog.records)
