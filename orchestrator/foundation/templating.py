"""Bash templates: `{{ name }}` in a bash command, given a context value, an upstream's result, a
conf key, a run parameter or a mapped instance's item. Pure (no Django): the task process, the
worker and the spec validation all use it, so what is validated at import is what runs.

    {{ dag_id }} {{ task_id }} {{ run_id }} {{ logical_date }} {{ try_number }}
    {{ infrastructure_try_number }} {{ map_index }}      the context's values
    {{ results.TASK_ID }}                                a direct upstream's result
    {{ results.TASK_ID.KEY }}                            a key of a dict result
    {{ conf.KEY }}                                       a key of the run's conf
    {{ params.NAME }}                                    a run parameter (context["params"])
    {{ NAME }}                                           a mapped instance's item (expand: {NAME: ...})

A value is never pasted into the command. `render` gives each substituted name an environment
variable of the task process, `ORCHESTRATOR_SUBST_0`, `ORCHESTRATOR_SUBST_1`, ... in the order
the names first appear (the same name twice shares one), and writes a reference to it where the
template stood: `"${ORCHESTRATOR_SUBST_0}"` where the template is bare (exactly one word, never
split or globbed), `${ORCHESTRATOR_SUBST_0}` inside double quotes or an unquoted here-document
(exactly its part of that text). Bash expands a variable's value without reading it as code, so
quotes, `;`, `$(...)`, backticks, newlines, globs and `$VAR` in a value reach the command as
the text they are. The names are the platform's: a task's environment holds no ORCHESTRATOR_*
variable the platform did not put there (`worker/host/environment.py`), so none is a user's.

Inside single quotes, `$'...'` or a quoted here-document (`<<'EOF'`) the shell expands nothing, so
a template there cannot be given its value: it is an import error, and a command stored before
that rule fails its attempt (`RenderError`). So does a value no process environment can hold
(a NUL character, a lone surrogate, over 128 KiB in one variable or 512 KiB in all).

A string is given as it is, null as the empty string, anything else as compact JSON; a missing
key, result or parameter as the empty string. Any other name between braces, a template in a
comment, and a template right after a backslash (`\\{{ name }}`) are left as written.

Where a template stands is found by `scan`, a small lexer of bash's quoting (see there).
"""
from __future__ import annotations

import enum
import json
import os
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

TEMPLATE_NAMES = ("dag_id", "task_id", "run_id", "logical_date", "try_number", "infrastructure_try_number", "map_index")
# Names a task's context has (or may have): a mapped task's NAME may not be one of them.
CONTEXT_NAMES = frozenset(
    {*TEMPLATE_NAMES, "conf", "results", "task_state", "idempotency_key", "context", "params", "ti"}
)
# The keyed kinds of substitution: `{{ PREFIX.… }}`.
KEYED_PREFIXES = ("conf.", "params.", "results.")
# The environment variable of the n-th substituted name.
ENV_PREFIX = "ORCHESTRATOR_SUBST_"
# Linux takes at most this many bytes for one `NAME=value` string of an environment (MAX_ARG_STRLEN,
# its terminating NUL included).
MAX_ENV_STRING_BYTES = 32 * 4096
# At most this many for all of a command's values: well within what a process may take in all
# (ARG_MAX, 2 MiB with the usual 8 MiB stack) and what the worker sends its fork server.
MAX_ENV_TOTAL_BYTES = 4 * MAX_ENV_STRING_BYTES

_TEMPLATE = re.compile(r"\{\{\s*([A-Za-z_][^\s{}]*)\s*\}\}")
# Characters after which a `#` starts a comment (a new word begins).
_WORD_BREAKS = frozenset(" \t\n;&|()<>")


class Quoting(enum.Enum):
    """Where a template stands, as bash reads the command."""

    BARE = "bare"  # outside quotes (also inside `$(...)` or backticks): a word of its own
    DOUBLE = "double"  # inside "..." (or $"...")
    HEREDOC = "heredoc"  # in the body of a here-document whose delimiter is unquoted
    SINGLE = "single"  # inside '...': nothing is expanded
    ANSI_C = "ansi_c"  # inside $'...': nothing is expanded
    QUOTED_HEREDOC = "quoted_heredoc"  # in the body of <<'EOF': nothing is expanded
    COMMENT = "comment"  # after a `#` that starts a comment: never run

    @property
    def expands(self) -> bool:
        """Whether bash expands a variable here (a template can be given its value)."""
        return self in (Quoting.BARE, Quoting.DOUBLE, Quoting.HEREDOC)

    @property
    def described(self) -> str:
        return {
            Quoting.SINGLE: "single quotes",
            Quoting.ANSI_C: "$'...' quotes",
            Quoting.QUOTED_HEREDOC: "a here-document whose delimiter is quoted",
        }.get(self, self.value)


@dataclass(frozen=True)
class Template:
    """One `{{ name }}` of a command: where it is, its name, and how bash would read it there."""

    start: int
    end: int
    text: str  # as written
    name: str
    quoting: Quoting


@dataclass(frozen=True)
class ResultReference:
    """`{{ results.TASK_ID[.KEY] }}` as written, resolved against the task's upstreams."""

    text: str
    task_id: str | None  # None: no upstream matches
    key: str | None


class Rendered(NamedTuple):
    """A command ready for `bash -c`, and the environment variables its references read."""

    command: str
    env: dict[str, str]


class RenderError(ValueError):
    """A command that cannot be run as its templates ask: the task's own problem, not the platform's."""


# --- the lexer ----------------------------------------------------------------------------------


def scan(command: str) -> list[Template]:
    """Every `{{ name }}` of a command, in order, with how bash would read the text there.

    A lexer of bash's quoting, no more: bare text, '...' (no escapes), $'...' (backslash escapes),
    "..." and $"..." (backslash escapes; `$(...)` and backticks inside open a fresh command),
    `$(...)` (also `$((...))`) and backticks (a fresh command, which ends at the matching `)`
    or backtick), comments (a `#` that starts a word, up to the end of the line) and
    here-documents (`<<WORD` and `<<-WORD`: the body, from the next line to the line that is
    WORD, is expanded like double-quoted text unless WORD has a quote or a backslash). A
    backslash outside single quotes takes the next character as written, so `\\{{` starts no
    template. Anything it does not model (`case` patterns' lone `)` inside `$(...)`, `${...}`
    operators) is read as plain text. Misread, a reference may show its quotes or be split into
    words; it is still a variable's expansion, so its value is never read as code. Pure; never
    raises.
    """
    lexer = _Lexer(command)
    lexer.command_text(0, closer=None)
    return lexer.found


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.found: list[Template] = []
        self.heredocs: list[tuple[str, bool, bool]] = []  # (delimiter, strip tabs, quoted), pending

    def template(self, i: int, quoting: Quoting) -> int | None:
        """The end of a template starting at `i` (recorded), or None if none starts there."""
        if not self.text.startswith("{{", i):
            return None
        match = _TEMPLATE.match(self.text, i)
        if match is None:
            return None
        self.found.append(Template(i, match.end(), match.group(0), match.group(1), quoting))
        return match.end()

    def command_text(self, i: int, closer: str | None) -> int:
        """Bare text from `i` up to `closer` (")" of `$(`, a backtick, or None: the end); returns
        the index after the closer."""
        text, n = self.text, len(self.text)
        depth = 0  # parentheses opened inside a `$(`
        word_start = True
        while i < n:
            end = self.template(i, Quoting.BARE)
            if end is not None:
                i, word_start = end, False
                continue
            c = text[i]
            if c == "\\":
                i, word_start = i + 2, False
                continue
            if closer == "`" and c == "`":
                return i + 1
            if closer == ")" and c == ")":
                if depth == 0:
                    return i + 1
                depth -= 1
            elif closer == ")" and c == "(":
                depth += 1
            opened = self.opening(i)
            if opened is not None:
                i, word_start = opened, False
            elif c == "#" and word_start:
                i = self.comment(i)
            elif c == "<" and text.startswith("<<<", i):
                i, word_start = i + 3, True  # a here-string: its word is read as any other
            elif c == "<" and text.startswith("<<", i):
                i, word_start = self.heredoc_operator(i + 2), False
            elif c == "\n":
                i, word_start = self.heredoc_bodies(i + 1), True
            else:
                i, word_start = i + 1, c in _WORD_BREAKS
        return n

    def opening(self, i: int) -> int | None:
        """A quote, `$(` or a backtick opening at `i`: the index after what it opens, or None."""
        c, after = self.text[i], self.text[i + 1 : i + 2]
        if c == "'":
            return self.single_quoted(i + 1, Quoting.SINGLE)
        if c == '"':
            return self.double_quoted(i + 1)
        if c == "`":
            return self.command_text(i + 1, "`")
        if c == "$" and after == "'":
            return self.single_quoted(i + 2, Quoting.ANSI_C)
        if c == "$" and after == '"':
            return self.double_quoted(i + 2)
        if c == "$" and after == "(":
            return self.command_text(i + 2, ")")
        return None

    def comment(self, i: int) -> int:
        """A comment from its `#` up to the end of its line (the newline is left to the caller)."""
        newline = self.text.find("\n", i)
        end = len(self.text) if newline < 0 else newline
        for match in _TEMPLATE.finditer(self.text, i, end):
            self.found.append(Template(match.start(), match.end(), match.group(0), match.group(1), Quoting.COMMENT))
        return end

    def single_quoted(self, i: int, quoting: Quoting) -> int:
        """'...' (no escapes) or $'...' (backslash escapes) from after the opening quote."""
        text, n = self.text, len(self.text)
        while i < n:
            end = self.template(i, quoting)
            if end is not None:
                i = end
            elif text[i] == "'":
                return i + 1
            else:
                i += 2 if text[i] == "\\" and quoting is Quoting.ANSI_C else 1
        return n

    def double_quoted(self, i: int) -> int:
        """"..." from after the opening quote; returns the index after the closing one."""
        return self.expanding_text(i, Quoting.DOUBLE, stop='"')

    def expanding_text(self, i: int, quoting: Quoting, stop: str) -> int:
        """Text that expands but does not split: double-quoted (up to `"`, which is consumed) or a
        here-document's line (up to the newline, which is not)."""
        text, n = self.text, len(self.text)
        while i < n:
            end = self.template(i, quoting)
            if end is not None:
                i = end
                continue
            c = text[i]
            if c == stop:
                return i + 1 if stop == '"' else i
            if c == "\\":
                i += 2
            elif c == "$" and text.startswith("(", i + 1):
                i = self.command_text(i + 2, ")")
            elif c == "`":
                i = self.command_text(i + 1, "`")
            else:
                i += 1
        return n

    def heredoc_operator(self, i: int) -> int:
        """After `<<`: note the here-document (its body follows the line) and skip its word."""
        text, n = self.text, len(self.text)
        strip = text.startswith("-", i)
        i += 1 if strip else 0
        while i < n and text[i] in " \t":
            i += 1
        word: list[str] = []
        quoted = False
        while i < n and text[i] not in _WORD_BREAKS:
            c = text[i]
            if c in "'\"":
                quoted = True
                close = text.find(c, i + 1)
                close = n if close < 0 else close
                word.append(text[i + 1 : close])
                i = close + 1
            elif c == "\\":
                quoted = True
                word.append(text[i + 1 : i + 2])
                i += 2
            else:
                word.append(c)
                i += 1
        if word or quoted:
            self.heredocs.append(("".join(word), strip, quoted))
        return i

    def heredoc_bodies(self, i: int) -> int:
        """At the start of a line: skip the bodies of the here-documents its command line opened."""
        pending, self.heredocs = self.heredocs, []
        text, n = self.text, len(self.text)
        for delimiter, strip, quoted in pending:
            while i < n:
                newline = text.find("\n", i)
                line_end = n if newline < 0 else newline
                line = text[i:line_end]
                if (line.lstrip("\t") if strip else line) == delimiter:
                    i = line_end + 1
                    break
                if quoted:
                    for match in _TEMPLATE.finditer(text, i, line_end):
                        self.found.append(Template(match.start(), match.end(), match.group(0), match.group(1), Quoting.QUOTED_HEREDOC))
                    i = line_end + 1
                else:
                    i = self.expanding_text(i, Quoting.HEREDOC, stop="\n") + 1
        return min(i, n)


# --- what a template stands for -----------------------------------------------------------------


def is_substitution(name: str, mapped_names: Collection[str] = ()) -> bool:
    """Whether `{{ name }}` is given a value (else it is left as written)."""
    return name in mapped_names or name in TEMPLATE_NAMES or name.startswith(KEYED_PREFIXES)


def substitutions(command: str, mapped_names: Collection[str] = ()) -> list[Template]:
    """The templates of a command that are given a value (not in a comment)."""
    return [t for t in scan(command) if t.quoting is not Quoting.COMMENT and is_substitution(t.name, mapped_names)]


def result_path(path: str, upstream_ids: Iterable[str]) -> tuple[str, str | None] | None:
    """(task_id, key or None) for the part after `results.`; None when no upstream matches.

    Task ids may hold dots, so the longest upstream id that the path starts with wins.
    """
    ids = set(upstream_ids)
    if path in ids:
        return path, None
    for task_id in sorted(ids, key=len, reverse=True):
        if path.startswith(task_id + ".") and len(path) > len(task_id) + 1:
            return task_id, path[len(task_id) + 1 :]
    return None


def result_references(command: str, upstream_ids: Iterable[str]) -> list[ResultReference]:
    """Every `{{ results.… }}` of a command that is given a value, resolved (for validation at import)."""
    ids = list(upstream_ids)
    found = []
    for template in substitutions(command):
        if template.name.startswith("results."):
            resolved = result_path(template.name[len("results.") :], ids)
            found.append(ResultReference(template.text, *(resolved or (None, None))))
    return found


def quoting_problems(command: str, mapped_names: Collection[str] = ()) -> list[str]:
    """Why each template of a command that bash would not expand cannot be given its value."""
    return [_unexpanded(t) for t in substitutions(command, mapped_names) if not t.quoting.expands]


def _unexpanded(template: Template) -> str:
    return (
        f"{template.text} is inside {template.quoting.described}, where the shell expands nothing; "
        f'write it bare or inside double quotes, e.g. echo "value: {template.text}"'
    )


def as_text(value: Any) -> str:
    """A string as it is, null as the empty string, anything else as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def value_of(name: str, context: Mapping[str, Any], mapped: Mapping[str, Any]) -> Any:
    """What `{{ name }}` stands for (None when missing); `name` is a substitution."""
    if name in mapped:
        return mapped[name]
    if name in TEMPLATE_NAMES:
        return context.get(name)
    prefix, _, key = name.partition(".")
    if prefix == "results":
        results = context.get("results") or {}
        resolved = result_path(key, results.keys()) if isinstance(results, Mapping) else None
        if resolved is None:
            return None
        result = results[resolved[0]]
        if resolved[1] is None:
            return result
        return result.get(resolved[1]) if isinstance(result, Mapping) else None
    values = context.get(prefix) or {}  # conf, params (a context may not have params yet)
    return values.get(key) if isinstance(values, Mapping) else None


def env_name(index: int) -> str:
    return f"{ENV_PREFIX}{index}"


def render(command: str, context: Mapping[str, Any], mapped: Mapping[str, Any] | None = None) -> Rendered:
    """The command with each substitution replaced by a reference to its environment variable,
    and those variables. Raises `RenderError` (saying which template) for a template bash would
    not expand, or a value no process environment can hold."""
    mapped = mapped or {}
    env: dict[str, str] = {}
    variables: dict[str, str] = {}  # template name -> its variable
    parts: list[str] = []
    done = 0
    for template in substitutions(command, mapped.keys()):
        if not template.quoting.expands:
            raise RenderError(_unexpanded(template))
        variable = variables.get(template.name)
        if variable is None:
            variable = variables[template.name] = env_name(len(variables))
            env[variable] = _passable(template, variable, as_text(value_of(template.name, context, mapped)))
        reference = "${" + variable + "}"
        parts += [command[done : template.start], f'"{reference}"' if template.quoting is Quoting.BARE else reference]
        done = template.end
    parts.append(command[done:])
    total = sum(len(os.fsencode(f"{name}={value}")) + 1 for name, value in env.items())
    if total > MAX_ENV_TOTAL_BYTES:
        raise RenderError(f"the command's values are {total} bytes in all, over the {MAX_ENV_TOTAL_BYTES} a task's environment may take for them")
    return Rendered("".join(parts), env)


def _passable(template: Template, variable: str, value: str) -> str:
    """`value`, if a process's environment can hold it; else RenderError saying why."""
    if "\x00" in value:
        raise RenderError(f"the value of {template.text} holds a NUL character, which no process's environment can hold")
    try:
        size = len(os.fsencode(f"{variable}={value}")) + 1
    except UnicodeEncodeError:
        raise RenderError(f"the value of {template.text} holds a lone surrogate, which cannot be encoded for a process's environment") from None
    if size > MAX_ENV_STRING_BYTES:
        raise RenderError(f"the value of {template.text} is {size} bytes, over the {MAX_ENV_STRING_BYTES} a process's environment variable may hold")
    return value
