"""The one resolver of dotted paths (`package.module.attr`, `pkg.mod.Class.method`, `pkg.mod:attr`).

Task callables, listeners, deadline callbacks and the spec validation all use it, so a path
that validates when a DAG is imported resolves the same way when the task runs. It needs
neither Django nor settings: the task process calls it before anything else is loaded.
"""
from __future__ import annotations

import importlib
import re
import sys

DOTTED_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*([.:][A-Za-z_][A-Za-z0-9_]*)*$")


class ObjectImportError(ImportError):
    """A dotted path that does not resolve; `__cause__` is what the import raised, if anything."""


def import_object(path: str) -> object:
    """Import the longest module prefix of `path` and walk the attributes after it.

    A path may name a module itself (a listener module). Raises ObjectImportError with a
    message fit for the person who wrote the path.
    """
    if not isinstance(path, str) or not DOTTED_PATH.match(path):
        raise ObjectImportError(f"{path!r} is not a dotted path like 'package.module.name'")
    parts = path.replace(":", ".").split(".")
    # Import prefixes from the shortest on while they are modules; the rest are attributes
    # (a class's method, say). Going up from the top names the module that is really broken.
    obj: object = None
    split = 0
    for split in range(1, len(parts) + 1):
        module_name = ".".join(parts[:split])
        if split > 1 and not hasattr(obj, "__path__") and module_name not in sys.modules:
            # A module that is no package has no submodules: the rest are its attributes. (Asking
            # the import system anyway raised and caught an error in every task process.)
            split -= 1
            break
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name and split > 1:
                split -= 1  # not a module: an attribute of the one before
                break
            if exc.name == module_name:
                raise ObjectImportError(f"no module named {module_name!r}") from None
            raise ObjectImportError(f"importing {module_name!r} failed: {exc}") from exc
        except Exception as exc:  # the module itself is broken (syntax error, raises on import)
            raise ObjectImportError(f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc
    for depth, attr in enumerate(parts[split:], start=split):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise ObjectImportError(f"{'.'.join(parts[:depth])!r} has no attribute {attr!r}") from None
    return obj
