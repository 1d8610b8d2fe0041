"""Reading the kernel's OOM-kill counters (`worker/host/oom.py`), read before every attempt."""
from __future__ import annotations

import os

import pytest

from orchestrator.worker.host import oom
from orchestrator.worker.host.memory import machine_oom_kills


@pytest.mark.parametrize(
    ("text", "count"),
    [
        (b"low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n", 2),  # cgroup v2 memory.events
        (b"oom_kill_disable 0\nunder_oom 0\noom_kill 7\n", 7),  # cgroup v1 memory.oom_control
        (b"pgfault 10\noom_kill 12\nnr_foo 1\n", 12),  # /proc/vmstat
        (b"oom_group_kill 4\n", None),  # another counter whose name starts the same
        (b"", None),
        (None, None),
    ],
)
def test_the_oom_kill_line_is_read_and_no_other(text, count):
    assert oom.oom_kill_in(text) == count


def test_where_the_counter_is_follows_the_process_s_cgroups():
    v2 = oom._candidates(b"0::/system.slice/worker.service\n")
    v1 = oom._candidates(b"12:pids:/x\n5:memory:/workers/one\n0::/\n")
    assert v2[0] == "/sys/fs/cgroup/system.slice/worker.service/memory.events"
    assert v1[0] == "/sys/fs/cgroup/memory/workers/one/memory.oom_control"
    # moved to another cgroup: its file reads differently, and so is looked up again
    assert oom._candidates(b"5:memory:/workers/two\n")[0] == "/sys/fs/cgroup/memory/workers/two/memory.oom_control"


def test_this_process_s_counters_read_as_the_kernel_has_them():
    found = oom.oom_kill_count()
    if found is None and not os.path.exists("/sys/fs/cgroup"):
        pytest.skip("no cgroup filesystem here")
    assert isinstance(found, int)
    assert found >= 0
    with open("/proc/vmstat") as vmstat:
        kernel = dict(line.split() for line in vmstat).get("oom_kill")
    assert machine_oom_kills() == (int(kernel) if kernel is not None else None)
    assert oom.read_bytes("/proc/self/no-such-file") is None
