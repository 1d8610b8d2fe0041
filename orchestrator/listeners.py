"""Listener hooks (pluggy, project name "orchestrator"), loaded from ORCHESTRATOR_LISTENERS.

A listener implements any subset of the hooks below. Hooks are called on a thread of their own
(`notify` only hands them over), so a listener is never on the path of a task or a scheduler
pass; one that raises is logged and skipped, one that hangs is left behind after
ORCHESTRATOR_LISTENER_TIMEOUT seconds. A process that exits first waits a few seconds for the
notifications it handed over.
"""
from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pluggy
from django.conf import settings
from django.db import DatabaseError

from orchestrator.foundation.importing import import_object

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
# Listeners of the project's own apps (the alerts app's), registered by them as they load.
_builtin: dict[str, Any] = {}


# The project's own apps that want every recorded failed attempt with what the report decided
# (the alerts app's rules): called inside the report's transaction, once the failure is recorded
# there, so what they write commits with the failure or not at all.
_failure_recorders: dict[str, Callable[..., None]] = {}


def on_failure_recorded(recorder: Callable[..., None], *, name: str) -> None:
    """Call `recorder(task_instance, context, fingerprint=, error=, dead_lettered=, at=)` for
    every failed attempt a report records from now on, inside the report's transaction: it must
    be quick (an INSERT at most) and leave sending and anything slow to another process."""
    _failure_recorders[name] = recorder


def failure_recorded(task_instance: Any, context: Any, **facts: Any) -> None:
    """A report is recording a failed attempt (inside its transaction): tell the apps that
    asked. A database error fails the report as an error of its own statements would (the
    transaction cannot go on after one); anything else a recorder raises is logged and never
    breaks the report."""
    for name, recorder in list(_failure_recorders.items()):
        try:
            recorder(task_instance, context, **facts)
        except DatabaseError:
            raise
        except Exception:
            log.exception("the %s recorder of failed attempts raised; the report goes on", name)


def register_builtin(plugin: Any, *, name: str) -> None:
    """Add one of the project's own listeners to every plugin manager from now on."""
    global _manager
    _builtin[name] = plugin
    _manager = None


def get_plugin_manager() -> pluggy.PluginManager:
    """The process's plugin manager, rebuilt when ORCHESTRATOR_LISTENERS changes (tests)."""
    global _manager, _loaded_from
    paths = tuple(settings.ORCHESTRATOR_LISTENERS)
    if _manager is None or paths != _loaded_from:
        manager = pluggy.PluginManager("orchestrator")
        manager.add_hookspecs(ListenerSpec)
        for name, plugin in _builtin.items():
            manager.register(plugin, name=name)
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
    """Hand `hook_name` to every listener, off the caller's path.

    The calls run in order on this process's listener thread, each in isolation: one that
    raises is logged, one that runs longer than ORCHESTRATOR_LISTENER_TIMEOUT is logged and left
    behind (its thread abandoned, a new one takes the queue), so a listener never holds up a
    task, a report or a scheduler pass."""
    hook = getattr(get_plugin_manager().hook, hook_name)
    impls = hook.get_hookimpls()
    if impls:
        _DISPATCHER.submit(hook_name, impls, kwargs)


def wanted(hook_name: str) -> bool:
    """Whether any listener implements `hook_name`: callers skip building what nobody reads."""
    return bool(getattr(get_plugin_manager().hook, hook_name).get_hookimpls())


def drain(timeout: float = 10.0) -> bool:
    """Wait until every notification handed over so far has been delivered (tests)."""
    return _DISPATCHER.drain(timeout)


class _Dispatcher:
    QUEUE_LIMIT = 10_000  # beyond this, notifications are dropped (and logged), never blocking

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=self.QUEUE_LIMIT)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._busy_since: float | None = None
        self._busy_with = ""

    def submit(self, hook_name: str, impls: list, kwargs: dict[str, Any]) -> None:
        self._ensure_thread()
        try:
            self._queue.put_nowait((hook_name, impls, kwargs))
        except queue.Full:
            log.error("listener queue full; %s dropped", hook_name)

    def drain(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._ensure_thread()
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.01)
        return False

    def _ensure_thread(self) -> None:
        with self._lock:
            busy = self._busy_since
            limit = float(getattr(settings, "ORCHESTRATOR_LISTENER_TIMEOUT", 10.0))
            if self._thread is not None and self._thread.is_alive() and (busy is None or time.monotonic() - busy < limit):
                return
            if self._thread is not None and self._thread.is_alive():
                log.error("listener %s has run for more than %.0fs; leaving it behind", self._busy_with, limit)
                self._queue.task_done()  # its notification will not complete
            self._busy_since = None
            self._thread = threading.Thread(target=self._run, name="listeners", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        me = threading.current_thread()
        while self._thread is me:
            try:
                hook_name, impls, kwargs = self._queue.get(timeout=1.0)
            except queue.Empty:
                continue
            for impl in impls:
                with self._lock:
                    if self._thread is not me:
                        return
                    self._busy_since, self._busy_with = time.monotonic(), f"{impl.plugin_name} ({hook_name})"
                try:
                    impl.function(*[kwargs.get(arg) for arg in impl.argnames])
                except Exception:
                    log.exception("listener %s raised in %s", impl.plugin_name, hook_name)
            with self._lock:
                if self._thread is not me:
                    return  # abandoned: the queue already counted this one as done
                self._busy_since = None
            self._queue.task_done()
        # A listener that hung here came back after being left behind: nothing more to do.


_DISPATCHER = _Dispatcher()
atexit.register(lambda: _DISPATCHER.drain(timeout=5.0))
