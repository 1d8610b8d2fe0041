"""Stable failure fingerprints: the same bug gives the same 12 hex digits, whatever its message."""
from __future__ import annotations

import hashlib
import re
import traceback
from types import TracebackType

_DIGITS = re.compile(r"\d+")


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:12]


def exception_fingerprint(exc_type: str, filename: str, lineno: int) -> str:
    """Hash of the exception type and the innermost frame (file and line), not the message."""
    return _digest("python", exc_type, filename, str(lineno))


def innermost_frame(tb: TracebackType | None) -> tuple[str, int]:
    frames = traceback.extract_tb(tb)
    if not frames:
        return ("<unknown>", 0)
    last = frames[-1]
    return (last.filename, last.lineno or 0)


def fingerprint_of(exc: BaseException) -> str:
    exc_type = f"{type(exc).__module__}.{type(exc).__qualname__}"
    filename, lineno = innermost_frame(exc.__traceback__)
    return exception_fingerprint(exc_type, filename, lineno)


def bash_fingerprint(exit_code: int, stderr_last_line: str) -> str:
    """Exit code plus the last stderr line with digits removed (timestamps, ids, counts)."""
    # Digits first, then whitespace: "exit status 3" and "exit status" leave the same text.
    return _digest("bash", str(exit_code), _DIGITS.sub("", stderr_last_line).strip())


def last_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            return line
    return ""
