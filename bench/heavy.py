"""A task module that imports heavy libraries at its top, as many users' modules do: Django's admin
(which loads Django's apps, models and all) and jsonschema. Its task does nothing: what a chain of
it measures is the import, paid by every task process unless the fork server preloads this module
(ORCHESTRATOR_PRELOAD_MODULES=bench.heavy)."""
from __future__ import annotations

import django.contrib.admin
import django.contrib.admin.models  # noqa: F401  what loads the apps
import jsonschema  # noqa: F401


def noop() -> None:
    return
