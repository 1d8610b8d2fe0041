"""Task modules compiled once in the fork server, never run there.

Every task process imports its task's module. Where no up-to-date `.pyc` can be read (the
image sets PYTHONDONTWRITEBYTECODE, or the task user may not write the DAG folder's
`__pycache__`), each one compiled the module's source again: a millisecond or two of CPU, and
hundreds of pages copied from the fork server, for every task.

The worker names the task's callable with each spawn (`learn`); the fork server finds the
modules on its way with importlib's own finders (which only look at files: nothing of the
task's runs here, since a task is untrusted and this process is not the task user's), and
compiles their source. A task process forked afterwards is given a cached code object only
when the source it reads itself holds exactly the bytes that were compiled
(`CachedSourceLoader`): an edited, replaced or unreadable file is compiled as it always was.
"""
from __future__ import annotations

import importlib.machinery as machinery
import os
import re
import sys
from collections import OrderedDict
from stat import S_ISREG
from types import CodeType

# Larger sources are left to the task process: compiling one here holds up every spawn.
MAX_SOURCE_BYTES = 256 * 1024
# Modules kept, and their sources' bytes in all (least recently learned go first): every byte
# this process holds is in the page tables each fork copies.
MAX_MODULES = 128
MAX_TOTAL_BYTES = 4 * 1024 * 1024
DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class _Compiled:
    __slots__ = ("stat", "source", "code")

    def __init__(self, stat: tuple[int, int], source: bytes, code: CodeType) -> None:
        self.stat = stat  # (mtime_ns, size) when compiled: whether to read it again
        self.source = source
        self.code = code


_CACHE: OrderedDict[str, _Compiled] = OrderedDict()


class CachedSourceLoader(machinery.SourceFileLoader):
    """The source loader, giving a module its code compiled in the fork server when the source
    it reads now is the one compiled."""

    def get_code(self, fullname: str) -> CodeType | None:
        path = self.get_filename(fullname)
        compiled = _CACHE.get(path)
        if compiled is not None:
            try:
                source = self.get_data(path)
            except OSError:
                source = None
            if source == compiled.source:
                return compiled.code
        return super().get_code(fullname)


def install() -> None:
    """Make the path finders load source through `CachedSourceLoader` (before anything is
    imported through them, so every directory's finder is one of these)."""
    hook = machinery.FileFinder.path_hook(
        (machinery.ExtensionFileLoader, machinery.EXTENSION_SUFFIXES),
        (CachedSourceLoader, machinery.SOURCE_SUFFIXES),
        (machinery.SourcelessFileLoader, machinery.BYTECODE_SUFFIXES),
    )
    sys.path_hooks[:] = [h for h in sys.path_hooks if not _is_file_finder_hook(h)] + [hook]
    sys.path_importer_cache.clear()


def _is_file_finder_hook(hook: object) -> bool:
    return getattr(hook, "__qualname__", "").startswith("FileFinder.path_hook")


def learn(dotted_path: str) -> list[str]:
    """Compile the source of each module on the way to `dotted_path` (a task's callable) that is
    not imported here yet; the files compiled. Never raises: a task whose modules cannot be
    found or compiled here is compiled by its own process, as before."""
    if not isinstance(dotted_path, str) or not DOTTED.match(dotted_path):
        return []
    # A directory on the path that does not exist (yet) is remembered as such by the import
    # system: forgotten again below, so that no task process inherits that from this one.
    absent = {entry for entry, finder in sys.path_importer_cache.items() if finder is None}
    try:
        return _learn(dotted_path.split("."))
    finally:
        for entry in [entry for entry, finder in sys.path_importer_cache.items() if finder is None and entry not in absent]:
            sys.path_importer_cache.pop(entry, None)


def _learn(parts: list[str]) -> list[str]:
    search: list[str] | None = None
    compiled: list[str] = []
    for end in range(1, len(parts) + 1):
        name = ".".join(parts[:end])
        module = sys.modules.get(name)
        if module is not None:
            search = getattr(module, "__path__", None)
            if search is None:
                return compiled  # a module, imported here: what follows are its attributes
            search = list(search)
            continue
        try:
            spec = machinery.PathFinder.find_spec(name, search)
        except Exception:  # a broken directory or name: the task's own import will say so
            return compiled
        if spec is None or not isinstance(spec.loader, CachedSourceLoader) or not spec.origin:
            return compiled
        if _compile(spec.origin):
            compiled.append(spec.origin)
        if spec.submodule_search_locations is None:
            return compiled
        search = list(spec.submodule_search_locations)
    return compiled


def _compile(path: str) -> bool:
    try:
        # Without blocking: a FIFO or a device named like a module must not hold up this process
        # (and with it every spawn); only a regular file is read.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        stat = (st.st_mtime_ns, st.st_size)
        known = _CACHE.get(path)
        if known is not None and known.stat == stat:
            _CACHE.move_to_end(path)
            return False
        if not S_ISREG(st.st_mode) or st.st_size > MAX_SOURCE_BYTES:
            return False
        with os.fdopen(fd, "rb", closefd=False) as handle:
            source = handle.read(MAX_SOURCE_BYTES + 1)
        if len(source) > MAX_SOURCE_BYTES:
            return False
        # As importlib compiles a module's source (`SourceLoader.source_to_code`).
        code = compile(source, path, "exec", dont_inherit=True, optimize=-1)
    except Exception:  # unreadable, or not valid Python: the task's import reports it
        _CACHE.pop(path, None)
        return False
    finally:
        os.close(fd)
    _CACHE[path] = _Compiled(stat, source, code)
    _CACHE.move_to_end(path)
    while len(_CACHE) > MAX_MODULES or (len(_CACHE) > 1 and sum(len(c.source) for c in _CACHE.values()) > MAX_TOTAL_BYTES):
        _CACHE.popitem(last=False)
    return True


def cached() -> list[str]:
    """The files whose code is cached, oldest first."""
    return list(_CACHE)


def clear() -> None:
    """Forget every compiled module."""
    _CACHE.clear()


def code_of(path: str) -> CodeType | None:
    """The code compiled here for the file at `path`, if any (what a task process may check
    its own module against)."""
    compiled = _CACHE.get(path)
    return compiled.code if compiled is not None else None
