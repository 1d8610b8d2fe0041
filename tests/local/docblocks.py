"""The command blocks of the README and the docs, read as a user reads them.

- Every ```sh block is run, its lines in order in one terminal, unless the line before it is
  `<!-- not run by the docs test: WHY -->` (a deployment, a benchmark, a process that never ends).
- A command is expected to exit 0, or N when its comment says `exit code N`.
- A ```yaml block after a sentence ending "Save this as `NAME`:" is written to NAME first.
- A plain ``` block after `<!-- output of: COMMAND -->` is what COMMAND prints: each of its lines
  must appear in that output, in order, with times and ids as they come (`...` stands for any text).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

NOT_RUN = re.compile(r"<!-- not run by the docs test: (.+?) -->")
OUTPUT_OF = re.compile(r"<!-- output of: (.+?) -->")
SAVE_AS = re.compile(r"[Ss]ave this as `([^`]+)`[^`]*:\s*$")
EXIT_CODE = re.compile(r"#.*\bexit code (\d+)")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d(\.\d+)?)?(\+\d\d:\d\d|Z)?")


@dataclass
class Command:
    text: str  # as typed, comments included: bash drops them
    expected_exit: int
    line: int

    @property
    def bare(self) -> str:
        """The command without its comment, as an output marker names it."""
        return re.split(r"\s+#", self.text, maxsplit=1)[0].strip()


@dataclass
class Saved:
    name: str
    text: str
    line: int


@dataclass
class Output:
    command: str
    lines: list[str]
    line: int


@dataclass
class Document:
    path: Path
    steps: list[Command | Saved] = field(default_factory=list)
    outputs: list[Output] = field(default_factory=list)
    not_run: list[tuple[int, str]] = field(default_factory=list)

    @property
    def commands(self) -> list[Command]:
        return [step for step in self.steps if isinstance(step, Command)]


def read(path: Path) -> Document:
    document = Document(path)
    lines = path.read_text().splitlines()
    number = 0
    while number < len(lines):
        opening = FENCE.match(lines[number])
        if not opening:
            number += 1
            continue
        indent, language = opening.group(1), opening.group(2)
        body: list[str] = []
        end = number + 1
        while end < len(lines) and lines[end].strip() != "```":
            body.append(lines[end][len(indent):] if lines[end].startswith(indent) else lines[end].lstrip())
            end += 1
        before = _line_before(lines, number)
        if language in ("sh", "bash"):
            skipped = NOT_RUN.search(before)
            if skipped:
                document.not_run.append((number + 1, skipped.group(1)))
            else:
                document.steps += _commands(body, number + 2)
        elif language in ("yaml", "yml") and SAVE_AS.search(before):
            document.steps.append(Saved(SAVE_AS.search(before).group(1), "\n".join(body) + "\n", number + 1))
        elif language == "" and OUTPUT_OF.search(before):
            document.outputs.append(Output(OUTPUT_OF.search(before).group(1).strip(), body, number + 1))
        number = end + 1
    return document


def _line_before(lines: list[str], number: int) -> str:
    for previous in reversed(lines[:number]):
        if previous.strip():
            return previous.strip()
    return ""


def _commands(body: list[str], first_line: int) -> list[Command]:
    """One command per line, a line ending in a backslash joined with the next; comment lines dropped."""
    found: list[Command] = []
    pending: list[str] = []
    start = first_line
    for offset, text in enumerate(body):
        if not pending:
            start = first_line + offset
            if not text.strip() or text.lstrip().startswith("#"):
                continue
        pending.append(text)
        if text.rstrip().endswith("\\"):
            continue
        joined = "\n".join(pending)
        code = EXIT_CODE.search(joined)
        found.append(Command(joined, int(code.group(1)) if code else 0, start))
        pending = []
    return found


def shape(text: str) -> str:
    """A line as compared: times as `<time>`, runs of spaces as one."""
    return re.sub(r"\s+", " ", TIME.sub("<time>", text)).strip()


def matches(expected: str, actual: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in shape(expected).split("..."))
    return re.fullmatch(pattern, shape(actual)) is not None


def missing_lines(expected: list[str], printed: str) -> list[str]:
    """The expected lines not found in the printed text, in order (none: it matches)."""
    actual = printed.splitlines()
    position = 0
    missing: list[str] = []
    for wanted in (line for line in expected if line.strip()):
        found = next((i for i in range(position, len(actual)) if matches(wanted, actual[i])), None)
        if found is None:
            missing.append(wanted)
        else:
            position = found + 1
    return missing
