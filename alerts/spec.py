"""One alert rule as written in a rules file (or the admin's form): validated into the model's
fields, each problem naming its field. The same check serves `import_alert_rules` and the admin.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from alerts import masking
from alerts.models import GROUP_KEYS, When
from deadlines import notifiers
from deadlines.notifiers import NotifierError
from orchestrator.foundation.importing import import_object
from retries.states import Category, Reason

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")
OWNER_PATTERN = NAME_PATTERN
# The keys of a rule, in the order an export writes them.
KEYS = (
    "name",
    "when",
    "category",
    "reason",
    "dag_id",
    "task_id",
    "owner",
    "notify",
    "notify_kwargs",
    "group_by",
    "repeat_after",
    "resolve",
)
FORMATS = ("json", "slack")
# notify_kwargs each built-in notifier takes (besides `format`, which every notifier takes).
NOTIFIER_KWARGS = {
    "webhook": ("url", "headers"),
    "email": ("to", "subject", "from_email"),
    "log": ("level", "message"),
}
LOG_LEVELS = ("debug", "info", "warning", "error")
PATTERN_MAX = 250


@dataclass
class Problems:
    items: list[tuple[str, str]] = field(default_factory=list)

    def add(self, path: str, message: str) -> None:
        self.items.append((path, message))

    def __bool__(self) -> bool:
        return bool(self.items)

    def messages(self) -> list[str]:
        return [f"{path}: {message}" if path else message for path, message in self.items]


def show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _string_list(raw: dict[str, Any], key: str, problems: Problems) -> list[str]:
    value = raw.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]  # a single value stands for a list of one
    if not isinstance(value, list) or not all(isinstance(v, str) and v and "\x00" not in v for v in value):
        problems.add(key, f"must be a list of non-empty strings, not {show(value)}")
        return []
    return list(dict.fromkeys(value))


def _check_values(key: str, values: list[str], allowed: list[str], problems: Problems) -> None:
    unknown = [v for v in values if v not in allowed]
    if unknown:
        problems.add(key, f"unknown value {show(unknown[0])} (one of {', '.join(allowed)})")


def check_notify(notify: Any, kwargs: Any, problems: Problems) -> None:
    """The notifier and its keyword arguments: a built-in's known keywords, a webhook's host in
    ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS, a dotted path that imports to a callable."""
    if not isinstance(notify, str) or not notify.strip():
        problems.add("notify", f"must be notifier:webhook, notifier:email, notifier:log or a dotted path, not {show(notify)}")
        return
    if not isinstance(kwargs, dict):
        problems.add("notify_kwargs", f"must be a mapping, not {show(masking.mask_value('notify_kwargs', kwargs))}")
        return
    form = kwargs.get("format", "json")
    if form not in FORMATS:
        problems.add("notify_kwargs.format", f"must be json or slack, not {show(form)}")
    if notify.startswith(notifiers.PREFIX):
        name = notify[len(notifiers.PREFIX) :]
        if name not in NOTIFIER_KWARGS:
            problems.add("notify", f"unknown notifier {name!r} (use one of {', '.join(NOTIFIER_KWARGS)})")
            return
        unknown = sorted(set(kwargs) - {"format", *NOTIFIER_KWARGS[name]})
        if unknown:
            accepted = ", ".join(sorted({"format", *NOTIFIER_KWARGS[name]}))
            problems.add(f"notify_kwargs.{unknown[0]}", f"not taken by {notify} (it takes {accepted})")
        if name == "webhook":
            _check_webhook(kwargs, problems)
        elif name == "email":
            to = kwargs.get("to")
            recipients = [to] if isinstance(to, str) else to
            if not isinstance(recipients, list) or not recipients or not all(isinstance(r, str) and "@" in r for r in recipients):
                problems.add("notify_kwargs.to", f"notifier:email needs an address or a list of them, not {show(to)}")
        elif name == "log" and kwargs.get("level", "warning") not in LOG_LEVELS:
            problems.add("notify_kwargs.level", f"must be one of {', '.join(LOG_LEVELS)}, not {show(kwargs.get('level'))}")
        return
    try:
        function = import_object(notify)
    except ImportError as exc:
        problems.add("notify", f"cannot import {notify!r}: {exc}")
        return
    if not callable(function):
        problems.add("notify", f"{notify!r} is not callable")


def _check_webhook(kwargs: dict[str, Any], problems: Problems) -> None:
    url = kwargs.get("url")
    if not isinstance(url, str):
        problems.add("notify_kwargs.url", "notifier:webhook needs an http(s) URL")
        return
    try:
        notifiers.allowed_host(url)
    except NotifierError as exc:
        # The message names the host at most, never the URL: its path is often the secret.
        problems.add("notify_kwargs.url", str(exc))
    headers = kwargs.get("headers")
    if headers is not None and (not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values())):
        problems.add("notify_kwargs.headers", "must be a mapping of header names to strings")


def validate(raw: object, stored_kwargs: dict[str, Any] | None = None) -> tuple[dict[str, Any], Problems]:
    """The model fields of one rule, and what is wrong with it. A masked value in notify_kwargs
    that is the mask of `stored_kwargs`' value at the same place keeps that value."""
    problems = Problems()
    if not isinstance(raw, dict):
        problems.add("", f"a rule must be a mapping, not {show(raw)}")
        return {}, problems
    for key in raw:
        if key not in KEYS:
            problems.add(str(key), f"unknown field (a rule has {', '.join(KEYS)})")
    name = raw.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        problems.add("name", f"must be 1-100 letters, digits, '_', '.' or '-', not {show(name)}")
    when = raw.get("when")
    if when not in When.values:
        problems.add("when", f"must be one of {', '.join(When.values)}, not {show(when)}")
    fields: dict[str, Any] = {"name": name, "when": when}
    for key in ("category", "reason", "dag_id", "task_id", "owner"):
        fields[key] = _string_list(raw, key, problems)
    _check_values("category", fields["category"], [c.value for c in Category], problems)
    _check_values("reason", fields["reason"], [r.value for r in Reason], problems)
    for key in ("dag_id", "task_id"):
        if any(len(p) > PATTERN_MAX for p in fields[key]):
            problems.add(key, f"a pattern is longer than {PATTERN_MAX} characters")
    bad_owner = [o for o in fields["owner"] if not OWNER_PATTERN.match(o)]
    if bad_owner:
        problems.add("owner", f"{show(bad_owner[0])} is no owner (1-100 letters, digits, '_', '.' or '-')")
    kwargs = raw.get("notify_kwargs")
    kwargs = {} if kwargs is None else kwargs
    if isinstance(kwargs, dict):
        try:
            kwargs = masking.unmask(kwargs, stored_kwargs or {})
        except masking.MaskedWithoutValue as exc:
            problems.add(exc.path, "is masked, and there is no stored value to keep: give the real value")
    check_notify(raw.get("notify"), kwargs, problems)
    fields["notify"] = raw.get("notify")
    fields["notify_kwargs"] = kwargs
    group_by = _string_list(raw, "group_by", problems)
    _check_values("group_by", group_by, list(GROUP_KEYS), problems)
    fields["group_by"] = group_by
    repeat_after = raw.get("repeat_after")
    if repeat_after is not None and (isinstance(repeat_after, bool) or not isinstance(repeat_after, int | float) or not repeat_after > 0):
        problems.add("repeat_after", f"must be a number of seconds > 0, or null (never repeat), not {show(repeat_after)}")
    elif repeat_after is not None and repeat_after > 10**9:
        problems.add("repeat_after", "must be at most 1000000000 seconds")
    fields["repeat_after"] = repeat_after
    resolve = raw.get("resolve", False)
    if not isinstance(resolve, bool):
        problems.add("resolve", f"must be true or false, not {show(resolve)}")
    fields["resolve"] = resolve
    return fields, problems


def rule_label(raw: object, index: int) -> str:
    name = raw.get("name") if isinstance(raw, dict) else None
    if isinstance(name, str) and name:
        return f"rule {name!r}"
    return f"rule #{index + 1}"


def export(rule: Any, *, include_secrets: bool = False) -> dict[str, Any]:
    """A rule as a rules file holds it: every key, in KEYS order."""
    repeat_after = rule.repeat_after
    if repeat_after is not None and float(repeat_after).is_integer():
        repeat_after = int(repeat_after)
    return {
        "name": rule.name,
        "when": rule.when,
        "category": list(rule.category),
        "reason": list(rule.reason),
        "dag_id": list(rule.dag_id),
        "task_id": list(rule.task_id),
        "owner": list(rule.owner),
        "notify": rule.notify,
        "notify_kwargs": dict(rule.notify_kwargs) if include_secrets else masking.mask(rule.notify_kwargs),
        "group_by": list(rule.group_by),
        "repeat_after": repeat_after,
        "resolve": rule.resolve,
    }
