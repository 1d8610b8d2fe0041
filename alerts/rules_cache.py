"""The alert rules, kept per process: a failure matched against no rule costs no query.

The rules are read again when their version (how many there are, the last id and the last
change) differs, and the version is looked at most every REFRESH seconds: a rule imported or
edited in another process applies within that time; in this process (the admin, an import) at
once.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from django.db.models import Count, Max

from alerts.matching import Rule
from alerts.models import AlertRule

REFRESH = 2.0

_lock = threading.Lock()
_checked = float("-inf")
_version: tuple[Any, ...] | None = None
_rules: dict[str, tuple[Rule, ...]] = {}


def invalidate() -> None:
    """Read the rules again on the next look (after a change made in this process)."""
    global _checked, _version
    with _lock:
        _checked, _version = float("-inf"), None


def rules_for(kind: str) -> Sequence[Rule]:
    """The rules of one kind of event (`When`)."""
    global _checked, _version, _rules
    now = time.monotonic()
    if now - _checked < REFRESH:
        return _rules.get(kind, ())
    with _lock:
        if now - _checked < REFRESH:
            return _rules.get(kind, ())
        stats = AlertRule.objects.aggregate(n=Count("id"), top=Max("id"), changed=Max("updated_at"))
        version = (stats["n"], stats["top"], stats["changed"])
        if version != _version:
            rules: dict[str, list[Rule]] = {}
            for rule in AlertRule.objects.order_by("name") if stats["n"] else ():
                rules.setdefault(rule.when, []).append(Rule.of(rule))
            _rules = {when: tuple(items) for when, items in rules.items()}
            _version = version
        _checked = time.monotonic()
    return _rules.get(kind, ())
