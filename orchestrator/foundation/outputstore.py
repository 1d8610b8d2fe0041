"""The output store: each attempt's whole output (up to a cap), kept outside the database.

The database keeps only the head and tail of each stream (worker/host/output.py), which is what the
pages show; the store keeps the raw bytes, up to `ORCHESTRATOR_TASK_OUTPUT_MAX_BYTES` per
attempt, for the link "full output". Hundreds of gigabytes of logs do not belong in PostgreSQL
rows: they would bloat its tables, its backups and its replication, and every deletion would be
a vacuum's work. Files are cheap to append, to serve and to delete.

The interface is small so that another store (object storage) can replace the files: a writer
per attempt fed while the task runs, a reader for the page, and a deletion by attempt for the
retention. `FileStore` is the one implementation; `NoStore` (no directory configured) keeps
nothing and the database's head and tail are all there is.

Each stream keeps at most half of the cap: its first and last quarter of the cap, and, when more
was written, a marker line between them saying how many bytes were cut. The middle is written
to a ring inside the file while the task runs (never more than a chunk in memory), and put in
order when the attempt ends, as the file gets its final name; until then the page says it is
not there yet.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, Protocol

from django.conf import settings

log = logging.getLogger(__name__)

STREAMS = ("stdout", "stderr")
# Attempts per directory (by task instance id): no directory grows without bound.
SHARD = 1000
COPY_CHUNK = 1 << 20

AttemptKey = tuple[int, int]  # (task_instance_id, attempt_token)


def cut_marker(cut: int, head: int, tail: int) -> bytes:
    """The line that stands where the middle of a stream was cut."""
    return f"\n[orchestrator: {cut} bytes cut here; the first {head} and the last {tail} bytes of this stream are kept]\n".encode()


class OutputWriter(Protocol):
    def write(self, stream: str, data: bytes) -> None: ...

    def close(self) -> None:
        """Make what was written readable (the attempt ended)."""

    def discard(self) -> None:
        """Forget what was written (it could not all be): never raises."""


class OutputStore(Protocol):
    enabled: bool

    def open_writer(self, attempt: AttemptKey) -> OutputWriter: ...

    def open_reader(self, attempt: AttemptKey, stream: str) -> BinaryIO | None: ...

    def size(self, attempt: AttemptKey, stream: str) -> int | None: ...

    def read(self, attempt: AttemptKey, stream: str, offset: int, length: int) -> bytes | None: ...

    def delete(self, attempts: Iterable[AttemptKey]) -> None: ...


class _NoWriter:
    def write(self, stream: str, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def discard(self) -> None:
        pass


class NoStore:
    """No output store: the database's head and tail are all that is kept."""

    enabled = False

    def open_writer(self, attempt: AttemptKey) -> OutputWriter:
        return _NoWriter()

    def open_reader(self, attempt: AttemptKey, stream: str) -> BinaryIO | None:
        return None

    def size(self, attempt: AttemptKey, stream: str) -> int | None:
        return None

    def read(self, attempt: AttemptKey, stream: str, offset: int, length: int) -> bytes | None:
        return None

    def delete(self, attempts: Iterable[AttemptKey]) -> None:
        pass


class FileStore:
    """One file per attempt and stream under `root`: `<root>/<ti // 1000>/<ti>-<token>.<stream>`.

    Names come from the two integers only, never from user text. Output may hold secrets a task
    printed: directories are created 2770 and files 0640, so only the worker's user and group
    read them (the web server serving them shares the worker's group; a task user does not),
    and files made in a directory take its group."""

    enabled = True

    def __init__(self, root: str | os.PathLike[str], max_bytes: int) -> None:
        self.root = Path(root)
        self.max_bytes = max(0, int(max_bytes))

    def path(self, attempt: AttemptKey, stream: str) -> Path:
        if stream not in STREAMS:
            raise ValueError(f"stream must be one of {', '.join(STREAMS)}, not {stream!r}")
        ti, token = int(attempt[0]), int(attempt[1])
        return self.root / str(ti // SHARD) / f"{ti}-{token}.{stream}"

    def open_writer(self, attempt: AttemptKey) -> OutputWriter:
        """A writer for one attempt; its directory is created now (OSError if it cannot be)."""
        directory = self.path(attempt, STREAMS[0]).parent
        if not self.root.is_dir():
            os.makedirs(self.root, mode=DIRECTORY_MODE, exist_ok=True)
            os.chmod(self.root, DIRECTORY_MODE)
        _make_directory(directory)
        per_stream = self.max_bytes // 2
        return _FileWriter({s: _CappedFile(self.path(attempt, s), per_stream // 2, per_stream - per_stream // 2) for s in STREAMS})

    def open_reader(self, attempt: AttemptKey, stream: str) -> BinaryIO | None:
        try:
            return open(self.path(attempt, stream), "rb")
        except OSError as exc:
            _missing(exc)
            return None

    def size(self, attempt: AttemptKey, stream: str) -> int | None:
        """Bytes kept of that stream; None when the store does not have it (yet)."""
        try:
            return self.path(attempt, stream).stat().st_size
        except OSError as exc:
            _missing(exc)
            return None

    def read(self, attempt: AttemptKey, stream: str, offset: int, length: int) -> bytes | None:
        reader = self.open_reader(attempt, stream)
        if reader is None:
            return None
        with reader:
            reader.seek(max(0, offset))
            return reader.read(max(0, length))

    def delete(self, attempts: Iterable[AttemptKey]) -> None:
        directories = set()
        for attempt in attempts:
            for stream in STREAMS:
                final = self.path(attempt, stream)
                directories.add(final.parent)
                for path in (final, _partial(final), _ordered(final)):
                    try:
                        path.unlink()
                    except FileNotFoundError:
                        pass
        for directory in directories:
            try:
                directory.rmdir()  # only once empty: another attempt's files keep it
            except OSError:
                pass


class _FileWriter:
    def __init__(self, files: dict[str, _CappedFile]) -> None:
        self.files = files

    def write(self, stream: str, data: bytes) -> None:
        self.files[stream].write(data)

    def close(self) -> None:
        errors = []
        for capped in self.files.values():
            try:
                capped.close()
            except OSError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def discard(self) -> None:
        for capped in self.files.values():
            capped.discard()


DIRECTORY_MODE = 0o2770  # the worker's user and group; new files take the directory's group
FILE_MODE = 0o640


def _make_directory(directory: Path) -> None:
    try:
        os.mkdir(directory, mode=DIRECTORY_MODE)
    except FileExistsError:
        return
    os.chmod(directory, DIRECTORY_MODE)  # whatever the umask; mkdir may also drop the setgid bit


def _missing(exc: OSError) -> None:
    """A file the store cannot read is one it does not have: the pages must not fail over it."""
    if not isinstance(exc, FileNotFoundError):
        log.warning("the output store cannot read its files: %s", exc)


def _partial(path: Path) -> Path:
    return path.with_name(path.name + ".part")


def _ordered(path: Path) -> Path:
    return path.with_name(path.name + ".ordered")


class _CappedFile:
    """One stream: its first `head` bytes, then a ring of its last `tail` bytes, in a `.part`
    file; on close, put in order (head, marker, tail) under the final name."""

    def __init__(self, path: Path, head: int, tail: int) -> None:
        self.path = path
        self.head = head
        self.tail = tail
        self.fd: int | None = None
        self.total = 0
        self.ring_pos = 0  # where the next tail byte goes, within the ring

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self.fd is None:
            self.fd = self._create()
        room = self.head - self.total
        if room > 0:
            _pwrite_all(self.fd, data[:room], self.total)
        self.total += len(data)
        data = data[max(0, room):]
        if not data or self.tail == 0:
            return
        data = data[-self.tail :]
        while data:
            n = min(self.tail - self.ring_pos, len(data))
            _pwrite_all(self.fd, data[:n], self.head + self.ring_pos)
            self.ring_pos = (self.ring_pos + n) % self.tail
            data = data[n:]

    def _create(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        try:
            fd = os.open(_partial(self.path), flags, FILE_MODE)
        except FileNotFoundError:
            # The retention removed the directory when it emptied it: make it again, once.
            _make_directory(self.path.parent)
            fd = os.open(_partial(self.path), flags, FILE_MODE)
        os.fchmod(fd, FILE_MODE)  # whatever the umask
        return fd

    @property
    def cut(self) -> int:
        return max(0, self.total - self.head - self.tail)

    def close(self) -> None:
        if self.fd is None:
            return  # nothing written: no file
        fd, self.fd = self.fd, None
        partial = _partial(self.path)
        try:
            if self.cut:
                self._write_in_order(fd)
                partial.unlink()
            else:
                os.rename(partial, self.path)  # never wrapped: head and tail are in order
        finally:
            os.close(fd)

    def discard(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)
        for path in (_partial(self.path), _ordered(self.path), self.path):
            try:
                path.unlink()
            except OSError:
                pass

    def _write_in_order(self, fd: int) -> None:
        """Head, marker, then the ring from its oldest byte: a second file, renamed over."""
        ordered = _ordered(self.path)
        out = os.open(ordered, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            os.fchmod(out, FILE_MODE)
            _copy(fd, out, 0, self.head)
            _write_all(out, cut_marker(self.cut, self.head, self.tail))
            _copy(fd, out, self.head + self.ring_pos, self.tail - self.ring_pos)
            _copy(fd, out, self.head, self.ring_pos)
        finally:
            os.close(out)
        os.rename(ordered, self.path)


def _copy(source: int, target: int, offset: int, length: int) -> None:
    while length > 0:
        chunk = os.pread(source, min(COPY_CHUNK, length), offset)
        if not chunk:
            raise OSError(f"the output file ended {length} bytes early")
        _write_all(target, chunk)
        offset += len(chunk)
        length -= len(chunk)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def output_store() -> OutputStore:
    """The store the settings name: files under ORCHESTRATOR_TASK_OUTPUT_DIR, or none."""
    directory = settings.ORCHESTRATOR_TASK_OUTPUT_DIR
    if not directory:
        return NoStore()
    return FileStore(directory, settings.ORCHESTRATOR_TASK_OUTPUT_MAX_BYTES)
