"""Resolve a dotted path (`package.module.attr`) to the object it names."""
from __future__ import annotations

import importlib
import re

DOTTED_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def import_object(path: str) -> object:
    """Import the module part of `path` and walk the attributes after it.

    Raises ImportError with a message fit for the person who wrote the path.
    """
    if not DOTTED_PATH.match(path):
        raise ImportError("not a dotted path like 'package.module.name'")
    parts = path.split(".")
    # The longest importable prefix is the module; the rest are attributes (a class's method, say).
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj: object = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                continue  # this prefix is not a module: try a shorter one
            raise ImportError(f"importing {module_name!r} failed: {exc}") from exc
        except Exception as exc:  # the module itself is broken (syntax error, raises on import)
            raise ImportError(f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc
        for depth, attr in enumerate(parts[split:], start=split):
            try:
                obj = getattr(obj, attr)
            except AttributeError:
                raise ImportError(f"{'.'.join(parts[:depth])!r} has no attribute {attr!r}") from None
        return obj
    raise ImportError(f"no module named {parts[0]!r}")
