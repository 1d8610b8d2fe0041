"""Freed memory given back by an idle process: once it has been idle long enough, never while it
works, and not twice for one idle spell."""
from __future__ import annotations

import platform
from pathlib import Path

import pytest

from orchestrator.foundation import memtrim
from orchestrator.foundation.memtrim import IdleTrim

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@glibc
def test_it_gives_back_what_malloc_holds_free():
    # Blocks under malloc's mmap threshold, freed below one still held: glibc keeps them.
    blocks = [bytearray(8000) for _ in range(20000)]
    held = bytearray(8000)
    del blocks
    before = _rss_kib()
    assert memtrim.trim()
    assert _rss_kib() < before - 100 * 1024
    del held


@glibc
def test_an_idle_process_is_trimmed_once_per_idle_spell():
    idle = IdleTrim(after=0.0)
    assert not idle.seen(False)  # working
    assert idle.seen(True)  # idle: trimmed
    assert not idle.seen(True)  # still the same idle spell
    assert not idle.seen(False)
    assert idle.seen(True)  # idle again after work


def test_a_process_is_not_trimmed_before_it_was_idle_long_enough():
    idle = IdleTrim(after=3600.0)
    assert not idle.seen(True)
    assert not idle.seen(True)
