"""Rules files: `import_alert_rules PATH` (all or nothing) and `export_alert_rules`.

A file holds a list of rules (YAML or JSON). A rule is matched to the stored one by name and
updated in place; a rule not in the file is kept. Export writes every rule in the same format,
its secrets masked unless asked for, so that export -> import changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from django.db import transaction

from alerts import rules_cache, spec
from alerts.models import AlertRule
from orchestrator.specs.files import FileError, read_spec_file


class RulesError(Exception):
    """Problems in the files of one import; nothing was written."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages


@dataclass
class ImportResult:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def import_path(path: str) -> ImportResult:
    """Validate every rule of the file, then write them all in one transaction, or nothing."""
    try:
        items = read_spec_file(Path(path))
    except FileError as exc:
        raise RulesError([str(exc).replace("holds no DAG", "holds no rule")]) from None
    stored = {rule.name: rule for rule in AlertRule.objects.all()}
    messages: list[str] = []
    seen: dict[str, int] = {}
    valid: list[dict[str, Any]] = []
    for item in items:
        label = spec.rule_label(item.data, item.index)
        name = item.data.get("name") if isinstance(item.data, dict) else None
        before = stored.get(name) if isinstance(name, str) else None
        fields, problems = spec.validate(item.data, before.notify_kwargs if before else None)
        messages += [f"{path}: {label}: {message}" for message in problems.messages()]
        if isinstance(name, str) and name in seen:
            messages.append(f"{path}: {label}: name: the file names this rule twice (first as rule #{seen[name] + 1})")
        elif isinstance(name, str):
            seen[name] = item.index
        if not problems:
            valid.append(fields)
    if messages:
        raise RulesError(messages)
    result = ImportResult()
    with transaction.atomic():
        for fields in valid:
            rule = stored.get(fields["name"])
            if rule is None:
                AlertRule.objects.create(**fields)
                result.created.append(fields["name"])
                continue
            if all(getattr(rule, key) == value for key, value in fields.items()):
                result.unchanged.append(rule.name)
                continue
            for key, value in fields.items():
                setattr(rule, key, value)
            rule.save()
            result.updated.append(rule.name)
    rules_cache.invalidate()
    return result


def export_text(*, include_secrets: bool = False) -> str:
    """Every rule as YAML, in the import's format."""
    documents = [spec.export(rule, include_secrets=include_secrets) for rule in AlertRule.objects.order_by("name")]
    return yaml.safe_dump(documents, sort_keys=False, default_flow_style=False, allow_unicode=True) if documents else "[]\n"
