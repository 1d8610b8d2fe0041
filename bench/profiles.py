"""Optional py-spy profiles of the benchmark's processes (`python -m bench --profile DIR`), and a
short summary of each: where the samples were, by innermost frame and by function anywhere on
the stack. py-spy must be installed (`pip install py-spy`)."""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path


def py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


class Profiler:
    """py-spy record of some processes for the length of one workload, in py-spy's raw format
    (one collapsed stack per line with its sample count). Only the thread holding the GIL is
    recorded (`--gil`): the samples are where the process's Python code spent its CPU. py-spy
    reads the processes without pausing them: pausing a worker of many threads at each sample
    slowed it so much that its leases expired."""

    def __init__(self, directory: Path, rate: int = 100) -> None:
        self.directory = directory
        self.rate = rate
        self.running: list[tuple[subprocess.Popen, Path]] = []
        directory.mkdir(parents=True, exist_ok=True)

    def start(self, label: str, pid: int, *, subprocesses: bool = False) -> None:
        executable = py_spy()
        if executable is None:
            print("py-spy is not installed: no profile")
            return
        path = self.directory / f"{label}.txt"
        argv = [executable, "record", "--pid", str(pid), "--rate", str(self.rate), "--format", "raw",
                "--nonblocking", "--gil", "--output", str(path)]
        if subprocesses:
            argv.append("--subprocesses")
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.running.append((process, path))

    def stop(self) -> list[Path]:
        """Stop every recording (py-spy writes its file on SIGINT) and return the files written."""
        written = []
        for process, _path in self.running:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process, path in self.running:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if path.exists():
                written.append(path)
        self.running = []
        return written


def summarize(path: Path, top: int = 12) -> str:
    """The innermost frames and the functions anywhere on the stack that hold the most samples."""
    leaves: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        frames = [f for f in stack.split(";") if not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        total += samples
        leaves[frames[-1]] += samples
        for frame in set(frames):
            anywhere[frame] += samples
    if not total:
        return f"{path.name}: no samples"
    lines = [f"{path.name}: {total} samples holding the GIL", "  innermost frames:"]
    lines += [f"    {100 * n / total:5.1f}%  {frame}" for frame, n in leaves.most_common(top)]
    lines.append("  on the stack:")
    lines += [f"    {100 * n / total:5.1f}%  {frame}" for frame, n in anywhere.most_common(top)]
    return "\n".join(lines)
