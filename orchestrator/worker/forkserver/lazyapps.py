"""Django's apps, loaded in a task process only when its task uses them.

The fork server used to call `django.setup()` before forking: some 30 MiB more in every worker,
and every fork copied (and every task's exit tore down) the page tables of all of it, about half
of what a task process cost. Few tasks use Django's models, but one that does may import them
anywhere, even inside a function it calls late. So the fork server installs `on_demand()`
instead, and the apps are loaded at the first moment anything needs them:

- an import of an installed app's `models` module (or a submodule of it): the apps are loaded
  *before* that module starts, so it is imported once, whole, by `django.setup()` itself;
- anything that asks the app registry (`apps.get_model()`, `get_user_model()`, a query).

Loading them costs a task that uses them a few hundred milliseconds; a deployment whose tasks
use models names one of its modules that imports them in ORCHESTRATOR_PRELOAD_MODULES, and the
fork server then loads the apps once, before forking (`preload` in forkserver.py).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Any

_lock = threading.RLock()
_loading = False


def load_apps() -> None:
    """`django.setup()`, once; a no-op while it runs (it imports the models modules itself)."""
    global _loading
    from django.apps import apps

    if apps.ready or _loading:
        return
    with _lock:
        if apps.ready or _loading:
            return
        _loading = True
        try:
            import django

            django.setup()
        finally:
            _loading = False


class _AlreadyImported(importlib.abc.Loader):
    """Hands the import machinery the module `django.setup()` has just imported, so it is not
    executed a second time (its models would be registered twice)."""

    def __init__(self, original_spec: importlib.machinery.ModuleSpec | None) -> None:
        self.original_spec = original_spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return sys.modules[spec.name]

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.original_spec


class _ModelsImport(importlib.abc.MetaPathFinder):
    """Loads the apps when an installed app's models module is about to be imported."""

    def __init__(self, apps: Any, models_modules: list[str]) -> None:
        self.apps = apps
        self.models_modules = models_modules

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if self.apps.ready or _loading:
            return None
        if not any(fullname == name or fullname.startswith(name + ".") for name in self.models_modules):
            return None
        load_apps()
        module = sys.modules.get(fullname)
        if module is None:
            return None  # not one that setup imports: the usual finders take it from here
        # The machinery would reload a module found in sys.modules from its own spec; a spec of
        # None makes it take ours, which hands back the module as it is.
        original, module.__spec__ = module.__spec__, None
        return importlib.machinery.ModuleSpec(fullname, _AlreadyImported(original), is_package=hasattr(module, "__path__"))


def on_demand() -> None:
    """In a process that did not call django.setup(): load the apps when something needs them."""
    from django.apps import apps
    from django.conf import settings

    if apps.ready:
        return
    sys.meta_path.insert(0, _ModelsImport(apps, [f"{name}.models" for name in settings.INSTALLED_APPS]))
    check_apps, check_models = apps.check_apps_ready, apps.check_models_ready

    def check_apps_ready() -> None:
        if not apps.apps_ready:
            load_apps()
        check_apps()

    def check_models_ready() -> None:
        if not apps.models_ready:
            load_apps()
        check_models()

    # Replaced on this one registry on purpose: its own checks run after the apps are loaded.
    apps.check_apps_ready = check_apps_ready  # type: ignore[method-assign]  # see the comment above
    apps.check_models_ready = check_models_ready  # type: ignore[method-assign]  # see the comment above
