"""Listener hooks (pluggy, project name "orchestrator"), loaded from ORCHESTRATOR_LISTENERS.

A listener implements any subset of the hooks below. One that raises is logged and skipped:
it never breaks the scheduler, the worker or the other listeners.
"""
from __future__ import annotations

import logging
from typing import Any

import pluggy
from django.conf import settings

from orchestrator.importing import import_object

hookspec = pluggy.HookspecMarker("orchestrator")
hookimpl = pluggy.HookimplMarker("orchestrator")

log = logging.getLogger(__name__)


class ListenerSpec:
    @hookspec
    def on_task_instance_running(self, task_instance): ...

    @hookspec
    def on_task_instance_success(self, task_instance): ...

    @hookspec
    def on_task_instance_failed(self, previous_state, task_instance, error, execution_context): ...

    @hookspec
    def on_task_instance_dead_lettered(self, task_instance, execution_context): ...

    @hookspec
    def on_dag_run_success(self, dag_run): ...

    @hookspec
    def on_dag_run_failed(self, dag_run): ...

    @hookspec
    def on_deadline_missed(self, deadline): ...

    @hookspec
    def on_circuit_opened(self, circuit): ...

    @hookspec
    def on_circuit_closed(self, circuit): ...


_manager: pluggy.PluginManager | None = None
_loaded_from: tuple[str, ...] = ()


def get_plugin_manager() -> pluggy.PluginManager:
    """The process's plugin manager, rebuilt when ORCHESTRATOR_LISTENERS changes (tests)."""
    global _manager, _loaded_from
    paths = tuple(settings.ORCHESTRATOR_LISTENERS)
    if _manager is None or paths != _loaded_from:
        manager = pluggy.PluginManager("orchestrator")
        manager.add_hookspecs(ListenerSpec)
        for path in paths:
            try:
                manager.register(_load(path), name=path)
            except Exception:
                log.exception("could not load listener %s", path)
        _manager, _loaded_from = manager, paths
    return _manager


def _load(path: str) -> Any:
    """A module path, or module:attribute / module.attribute naming an object."""
    return import_object(path)


def notify(hook_name: str, **kwargs: Any) -> None:
    """Call every implementation of `hook_name`, each in isolation."""
    hook = getattr(get_plugin_manager().hook, hook_name)
    for impl in hook.get_hookimpls():
        try:
            impl.function(*[kwargs.get(arg) for arg in impl.argnames])
        except Exception:
            log.exception("listener %s raised in %s", impl.plugin_name, hook_name)
