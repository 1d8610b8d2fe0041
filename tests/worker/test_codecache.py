"""Task modules compiled once in the fork server (`forkserver/codecache.py`): never run there,
given to a task process only when the source it reads is the one compiled.

The unit cases run in a fresh interpreter: `install()` changes how its process imports."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.worker.conftest import settle, trigger

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """
import importlib, json, os, sys
from orchestrator.worker.forkserver import codecache
codecache.install()
sys.path.insert(0, sys.argv[1])
def uses_cached(module):
    code = codecache.code_of(module.__file__)
    return code is not None and any(const is module.f.__code__ for const in code.co_consts)
"""


def run(tmp_path: Path, body: str, files: dict[str, bytes | str]) -> dict:
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else textwrap.dedent(content).encode())
    code = PRELUDE + textwrap.dedent(body)
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


SIDE_EFFECT = """
import pathlib
pathlib.Path(__file__).with_name("ran-" + __name__).touch()
def f():
    return __name__
"""


def test_learning_compiles_the_modules_on_the_way_without_running_them(tmp_path):
    out = run(
        tmp_path,
        """
        learned = codecache.learn("pkg.sub.mod.f")
        ran_before = sorted(os.listdir(os.path.join(sys.argv[1], "pkg")))
        mod = importlib.import_module("pkg.sub.mod")
        print(json.dumps({"learned": [os.path.relpath(p, sys.argv[1]) for p in learned], "ran_before": ran_before,
                          "uses_cached": uses_cached(mod), "result": mod.f()}))
        """,
        {"pkg/__init__.py": SIDE_EFFECT, "pkg/sub/__init__.py": "", "pkg/sub/mod.py": SIDE_EFFECT},
    )
    assert out["learned"] == ["pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/mod.py"]
    assert [name for name in out["ran_before"] if name.startswith("ran-")] == []  # nothing executed while learning
    assert out["uses_cached"] is True
    assert out["result"] == "pkg.sub.mod"


def test_a_source_changed_after_it_was_compiled_is_compiled_again(tmp_path):
    out = run(
        tmp_path,
        """
        path = os.path.join(sys.argv[1], "edited.py")
        codecache.learn("edited.f")
        stat = os.stat(path)
        with open(path, "r+b") as handle:  # same size, same times: only the bytes say it changed
            handle.write(b"def f(): return 'new'")
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        codecache.learn("edited.f")  # the stat looks unchanged: nothing compiled again
        mod = importlib.import_module("edited")
        print(json.dumps({"result": mod.f(), "uses_cached": uses_cached(mod)}))
        """,
        {"edited.py": "def f(): return 'old'"},
    )
    assert out == {"result": "new", "uses_cached": False}


def test_the_cache_keeps_within_its_bounds_dropping_the_least_recently_learned(tmp_path):
    out = run(
        tmp_path,
        """
        codecache.MAX_MODULES, codecache.MAX_TOTAL_BYTES = 3, 2020
        for name in ("m1", "m2", "m3", "m4"):
            codecache.learn(name + ".f")
        by_count = [os.path.basename(p) for p in codecache.cached()]
        codecache.learn("big.f")  # 2,001 bytes: only one other module fits beside it
        print(json.dumps({"by_count": by_count, "by_bytes": [os.path.basename(p) for p in codecache.cached()]}))
        """,
        {**{f"m{n}.py": "def f(): pass\n" for n in range(1, 5)}, "big.py": "def f(): pass\n" + "#" * 1986 + "\n"},
    )
    assert out == {"by_count": ["m2.py", "m3.py", "m4.py"], "by_bytes": ["m4.py", "big.py"]}


def test_a_directory_missing_while_learning_is_not_remembered_as_missing(tmp_path):
    """A directory on the import path that appears after the fork server looked for a module
    there is searched by the task processes forked afterwards."""
    out = run(
        tmp_path,
        """
        later = os.path.join(sys.argv[1], "later")
        sys.path.insert(0, later)
        learned = codecache.learn("appears.f")
        os.mkdir(later)
        with open(os.path.join(later, "appears.py"), "w") as handle:
            handle.write("def f(): return 'found'")
        print(json.dumps({"learned": learned, "result": importlib.import_module("appears").f()}))
        """,
        {},
    )
    assert out == {"learned": [], "result": "found"}


@pytest.mark.parametrize(
    ("source", "error"),
    [
        (b"def f(:\n", "SyntaxError"),
        (b"def f():\n    return 1\x00\n", "SyntaxError"),
        (b"x = " + b"(" * 300 + b"1" + b")" * 300 + b"\ndef f(): pass\n", "SyntaxError"),  # too deeply nested for the parser
        (b"def f(): return '\xff\xfe'\n", "SyntaxError"),  # not UTF-8
        (b"# " + b"x" * (300 * 1024) + b"\ndef f(): return 'big'\n", None),  # past MAX_SOURCE_BYTES: left to the task
    ],
)
def test_a_source_that_cannot_be_compiled_here_is_left_to_the_task(tmp_path, source, error):
    out = run(
        tmp_path,
        """
        learned = codecache.learn("hostile.f")
        try:
            mod = importlib.import_module("hostile")
            said = None
        except BaseException as exc:
            said = type(exc).__name__
        print(json.dumps({"learned": learned, "said": said}))
        """,
        {"hostile.py": source},
    )
    assert out == {"learned": [], "said": error}


def test_a_fifo_named_like_a_module_does_not_hold_up_the_fork_server(tmp_path):
    out = run(
        tmp_path,
        """
        os.mkfifo(os.path.join(sys.argv[1], "piped.py"))
        print(json.dumps({"learned": codecache.learn("piped.f"), "cached": codecache.cached()}))
        """,
        {},
    )
    assert out == {"learned": [], "cached": []}


@pytest.mark.parametrize("path", ["", "os.path.join", "no.such.module", "pkg..f", "../etc/passwd", "x\x00y", "a" * 5000])
def test_a_name_that_leads_nowhere_compiles_nothing(tmp_path, path):
    out = run(tmp_path, f"print(json.dumps({{'learned': codecache.learn({path!r}), 'cached': codecache.cached()}}))", {})
    assert out == {"learned": [], "cached": []}


@pytest.mark.django_db(transaction=True)
@pytest.mark.integration
def test_a_task_process_forked_after_the_first_runs_the_code_compiled_by_its_fork_server(worker, make_dag):
    task = "tests.worker.compiled_ahead.compiled_ahead"
    dag = make_dag(
        [
            {"task_id": "a", "python_callable": task},
            {"task_id": "b", "python_callable": task, "upstream": ["a"]},
        ]
    )
    worker(PYTHONDONTWRITEBYTECODE="1")
    run_ = trigger(dag)
    first = settle(run_, "a", ("success",), timeout=60)
    second = settle(run_, "b", ("success",), timeout=60)
    # The first task's process was forked before the fork server heard of its module.
    assert first.result == {"compiled_ahead": False}
    assert second.result == {"compiled_ahead": True}
