"""orchestrator.foundation.importing.import_object: the one resolver of dotted paths, for every kind of path."""
from __future__ import annotations

import pytest

from orchestrator.foundation.importing import ObjectImportError, import_object
from orchestrator.specs.value_checks import check_callable
from tests.worker import tasks


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("tests.worker.tasks.succeed", tasks.succeed),  # module.function
        ("tests.worker.tasks.GracefulSleeper", tasks.GracefulSleeper),  # module.Class
        ("tests.worker.tasks.Greeter.greet", tasks.Greeter.greet),  # module.Class.method
        ("tests.worker.tasks:succeed", tasks.succeed),  # module:attribute
        ("tests.worker.tasks", tasks),  # a module itself (a listener module)
    ],
)
def test_it_resolves_each_kind_of_path(path, expected):
    assert import_object(path) is expected


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.worker.nowhere.f", r"'tests\.worker' has no attribute 'nowhere'"),
        ("tests.worker.tasks.Greeter.wave", r"'tests\.worker\.tasks\.Greeter' has no attribute 'wave'"),
        ("nowhere_at_all.f", r"no module named 'nowhere_at_all'"),
        ("tests.importing.broken_module.f", r"importing 'tests\.importing\.broken_module' raised RuntimeError: broken on import"),
        ("not a path", r"not a dotted path"),
        ("trailing.", r"not a dotted path"),
    ],
)
def test_it_names_what_does_not_resolve(path, message):
    with pytest.raises(ObjectImportError, match=message):
        import_object(path)


def test_it_keeps_the_cause_of_a_broken_module():
    with pytest.raises(ObjectImportError) as raised:
        import_object("tests.importing.broken_module.f")
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_spec_validation_accepts_exactly_what_the_task_process_runs():
    """A class's method validates at import time and resolves to the same object at run time."""
    from orchestrator.worker.task.runner import import_callable

    assert check_callable("tests.worker.tasks.Greeter.greet") is None
    assert import_callable("tests.worker.tasks.Greeter.greet") is tasks.Greeter.greet



@pytest.mark.parametrize(
    ("path", "modules"),
    [
        ("tests.worker.tasks.succeed", ["tests", "tests.worker", "tests.worker.tasks"]),
        ("tests.worker.tasks.Greeter.greet", ["tests", "tests.worker", "tests.worker.tasks"]),
        ("os.path.join", ["os", "os.path"]),  # a submodule that is no package's: still imported
    ],
)
def test_only_modules_are_imported_never_a_module_s_attributes(monkeypatch, path, modules):
    """An attribute of a plain module is not asked of the import system (which would raise and
    catch an error in every task process)."""
    import importlib

    asked: list[str] = []
    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: asked.append(name) or real(name, *a))
    assert import_object(path) is not None
    assert asked == modules
