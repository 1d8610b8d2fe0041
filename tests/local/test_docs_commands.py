"""Every command block of the README and the docs, typed into a terminal of a fresh copy of the
repository while its `make run` stack is up: each command exits as the text says, and what the
text shows a command printing is what it prints (the rules: tests/local/docblocks.py)."""
from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.local.embedded_redis import free_port
from tests.conftest import ROOT, stop_group
from tests.local import docblocks
from tests.local.stack import Stack, clean_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

# The README's sections that are reference tables, not something to try.
REFERENCE_SECTIONS = {"Configuration", "Command line", "Layout", "Documentation", "Screenshots"}
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
WITH_COMMANDS = [path for path in DOCUMENTS if docblocks.read(path).steps or docblocks.read(path).outputs]
README_PORT = "127.0.0.1:8000"


@pytest.fixture(scope="module")
def stack(checkout) -> Iterator[Stack]:
    running = Stack(checkout, free_port())
    try:
        running.wait_for_banner()
        yield running
    finally:
        running.stop()


def run_document(document: docblocks.Document, checkout: Path, port: int, work: Path) -> list[tuple[docblocks.Command, int, str, str]]:
    """The document's commands in one bash, as one terminal: what one sets (PATH, a variable)
    the next sees. Each command's exit code, output and errors."""
    # `make run` or `make test` typed here would start a second stack or the suite inside the suite.
    assert not [c.bare for c in document.commands if c.bare.startswith("make ")], "mark it not run"
    for step in document.steps:
        if isinstance(step, docblocks.Saved):
            target = (checkout / step.name).resolve()
            assert checkout.resolve() in target.parents, f"{step.name}: a file outside the checkout"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(step.text)
    script = ['export PATH="$PWD/.venv/bin:$PATH"']
    for number, command in enumerate(document.commands):
        text = command.text.replace(README_PORT, f"127.0.0.1:{port}")
        script.append(f'{{ {text}\n}} >"{work}/{number}.out" 2>"{work}/{number}.err" </dev/null; echo $? >"{work}/{number}.rc"')
    terminal = subprocess.Popen(["bash", "-c", "\n".join(script)], cwd=checkout, env=clean_env(checkout), start_new_session=True)
    try:
        terminal.wait(timeout=480)
    finally:
        stop_group(terminal)
    results = []
    for number, command in enumerate(document.commands):
        rc = work / f"{number}.rc"
        code = int(rc.read_text()) if rc.exists() else -1
        results.append((command, code, (work / f"{number}.out").read_text(), (work / f"{number}.err").read_text()))
    return results


@pytest.mark.parametrize("path", WITH_COMMANDS, ids=lambda path: path.name)
def test_every_command_works_as_written(path, checkout, stack, tmp_path):
    document = docblocks.read(path)
    port = re.search(r"running at http://127\.0\.0\.1:(\d+)/", stack.output).group(1)
    results = run_document(document, checkout, int(port), tmp_path)
    problems = [
        f"{path.name}:{command.line}: `{command.bare}` exited {code}, expected {command.expected_exit}\n{out}{err}"
        for command, code, out, err in results
        if code != command.expected_exit
    ]
    printed = {command.bare.replace(README_PORT, f"127.0.0.1:{port}"): out for command, _, out, _ in results}
    for output in document.outputs:
        shown = output.command.replace(README_PORT, f"127.0.0.1:{port}")
        assert shown in printed, f"{path.name}:{output.line}: the output of `{output.command}`, a command the text never runs"
        missing = docblocks.missing_lines([line.replace(README_PORT, f"127.0.0.1:{port}") for line in output.lines], printed[shown])
        if missing:
            problems.append(f"{path.name}:{output.line}: `{output.command}` no longer prints {missing}; it printed:\n{printed[shown]}")
    assert problems == [], "\n\n".join(problems) + "\n\nthe stack said:\n" + stack.output[-3000:]


def test_each_section_of_the_readme_that_shows_how_has_a_command_to_try():
    text = (ROOT / "README.md").read_text()
    sections = re.split(r"\n## ", text)[1:]
    without = []
    for section in sections:
        title, _, body = section.partition("\n")
        if title in REFERENCE_SECTIONS:
            continue
        if not any(match for match in re.finditer(r"```sh\n", body)):
            without.append(title)
    assert without == []


def test_every_block_that_is_not_run_says_why_and_every_output_names_its_command():
    for path in DOCUMENTS:
        document = docblocks.read(path)
        assert all(reason.strip() for _, reason in document.not_run), path
        typed = {command.bare for command in document.commands}
        for output in document.outputs:
            assert output.command in typed, f"{path.name}:{output.line}: `{output.command}` is not a command of the text"


def test_the_rules_of_the_blocks(tmp_path):
    """The reader itself: continuation lines, exit codes, saved files, outputs, wildcards."""
    page = tmp_path / "page.md"
    page.write_text(
        "Save this as `demo.yaml`:\n\n```yaml\ndag_id: demo\n```\n\n"
        "```sh\n# a comment line\norchestrator import_dags demo.yaml\n"
        "orchestrator trigger_dag demo --wait   # fails; exit code 1\n"
        "curl -s \\\n  http://x/ # a '#' inside\n```\n\n"
        "<!-- output of: orchestrator trigger_dag demo --wait -->\n```\nmanual__2026-01-01T00:00:00+00:00\nfailed\n```\n\n"
        "<!-- not run by the docs test: a deployment -->\n```sh\nkubectl apply\n```\n"
    )
    document = docblocks.read(page)
    assert [type(step).__name__ for step in document.steps] == ["Saved", "Command", "Command", "Command"]
    assert document.steps[0].name == "demo.yaml"
    assert document.steps[0].text == "dag_id: demo\n"
    assert [c.expected_exit for c in document.commands] == [0, 1, 0]
    assert document.commands[2].text == "curl -s \\\n  http://x/ # a '#' inside"
    assert document.not_run == [(22, "a deployment")]
    [output] = document.outputs
    assert output.command == "orchestrator trigger_dag demo --wait" == document.commands[1].bare
    printed = "manual__2026-11-28T13:00:01.123456+00:00\ntasks: 1/1 done\nfailed\n"
    assert docblocks.missing_lines(output.lines, printed) == []
    assert docblocks.missing_lines(output.lines, "manual__x\nsuccess\n") == output.lines
    assert docblocks.missing_lines(["tasks: ... done"], "tasks:   3/3 done") == []
