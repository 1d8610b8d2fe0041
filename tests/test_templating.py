"""Bash templates: where each stands (the quoting lexer), and what `render` hands bash."""
from __future__ import annotations

import os
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.foundation.templating import (
    MAX_ENV_STRING_BYTES,
    Quoting,
    Rendered,
    RenderError,
    quoting_problems,
    render,
    result_references,
    scan,
)

HOSTILE = ["'; touch F; '", '"; touch F; "', "$(touch F)", "`touch F`", "\ntouch F", "*", "$HOME", "", "{{ dag_id }}", "a  b\tc"]


def bash(rendered: Rendered) -> str:
    """What bash prints for a rendered command, with the environment it comes with."""
    env = {"PATH": os.environ["PATH"], "HOME": "/nonexistent-home", **rendered.env}
    done = subprocess.run(["bash", "-c", rendered.command], env=env, capture_output=True, timeout=10)
    assert done.returncode == 0, done.stderr
    return os.fsdecode(done.stdout)  # as bytes: no newline translation


def quotings(command: str) -> list[tuple[str, Quoting]]:
    return [(t.name, t.quoting) for t in scan(command)]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("echo {{ a }}", Quoting.BARE),
        ('echo "x {{ a }} y"', Quoting.DOUBLE),
        ('echo $"x {{ a }}"', Quoting.DOUBLE),
        ("echo 'x {{ a }}'", Quoting.SINGLE),
        ("echo $'x\\' {{ a }}'", Quoting.ANSI_C),  # \' does not end $'...'
        ("echo 'x\\' {{ a }}", Quoting.BARE),  # but ends '...'
        ('echo "x\\" {{ a }}"', Quoting.DOUBLE),
        ("echo \"it's {{ a }}\"", Quoting.DOUBLE),
        ("echo '\"' {{ a }}", Quoting.BARE),
        ("echo \\' {{ a }}", Quoting.BARE),
        ('echo "$(echo {{ a }})"', Quoting.BARE),  # a fresh command inside double quotes
        ("echo \"$(echo '{{ a }}')\"", Quoting.SINGLE),
        ('echo "`echo {{ a }}`"', Quoting.BARE),
        ("echo $(echo \"(\" ')' {{ a }})", Quoting.BARE),
        ("echo $( (echo) ; echo '{{ a }}')", Quoting.SINGLE),
        ("echo $(( {{ a }} + 1 ))", Quoting.BARE),
        ("echo # it's {{ a }}", Quoting.COMMENT),
        ("echo a#b {{ a }}", Quoting.BARE),
        ("# it's\necho {{ a }}", Quoting.BARE),
        ("cat <<EOF\nit's {{ a }}\nEOF", Quoting.HEREDOC),
        ("cat <<-\"EOF\"\n\t{{ a }}\n\tEOF", Quoting.QUOTED_HEREDOC),
        ("cat <<'EOF'\nx\nEOF\necho {{ a }}", Quoting.BARE),
        ("cat <<<'{{ a }}'", Quoting.SINGLE),
    ],
)
def test_it_reads_where_a_template_stands_as_bash_would(command, expected):
    assert quotings(command)[-1] == ("a", expected)


def test_a_backslash_before_a_template_keeps_it_as_written():
    assert scan("echo \\{{ a }}") == []
    assert render("echo \\{{ conf.a }} {{ conf.a }}", {"conf": {"a": "v"}}) == Rendered(
        'echo \\{{ conf.a }} "${ORCHESTRATOR_SUBST_0}"', {"ORCHESTRATOR_SUBST_0": "v"}
    )


def test_it_gives_each_name_one_variable_and_references_it_by_where_it_stands():
    context = {"dag_id": "d", "try_number": 2, "conf": {"team": "a b"}}
    rendered = render('run {{ dag_id }} "team {{ conf.team }} try {{try_number}}" {{ conf.team }} {{ other }}', context)
    assert rendered.command == (
        'run "${ORCHESTRATOR_SUBST_0}" "team ${ORCHESTRATOR_SUBST_1} try ${ORCHESTRATOR_SUBST_2}" "${ORCHESTRATOR_SUBST_1}" {{ other }}'
    )
    assert rendered.env == {"ORCHESTRATOR_SUBST_0": "d", "ORCHESTRATOR_SUBST_1": "a b", "ORCHESTRATOR_SUBST_2": "2"}


def test_a_string_is_as_it_is_null_is_empty_and_anything_else_compact_json():
    results = {"up": {"n": 1, "none": None, "list": [1, "é"], "flag": True}, "text": "plain"}
    context = {"results": results, "conf": {"n": 1.5}, "params": {"p": {"a": None}}}
    command = "{{ results.up }} {{ results.up.n }} {{ results.up.none }} {{ results.up.list }} {{ results.up.flag }} {{ results.text }}"
    rendered = render(command + " {{ conf.n }} {{ params.p }} {{ conf.missing }} {{ results.up.missing }} {{ params.x }}", context)
    assert list(rendered.env.values()) == [
        '{"n":1,"none":null,"list":[1,"é"],"flag":true}', "1", "", '[1,"é"]', "true", "plain", "1.5", '{"a":null}', "", "", "",
    ]


def test_params_are_empty_while_the_context_has_none():
    assert render("echo {{ params.team }}", {"conf": {}}).env == {"ORCHESTRATOR_SUBST_0": ""}


def test_a_mapped_item_is_a_substitution_only_on_a_mapped_instance():
    assert render("echo {{ word }}", {}, {"word": {"k": [1]}}).env == {"ORCHESTRATOR_SUBST_0": '{"k":[1]}'}
    assert render("echo {{ word }}", {}) == Rendered("echo {{ word }}", {})
    assert quoting_problems("echo '{{ word }}'") == []
    assert len(quoting_problems("echo '{{ word }}'", ["word"])) == 1


@pytest.mark.parametrize(
    "command",
    ["echo '{{ conf.x }}'", "echo $'{{ dag_id }}'", "cat <<'EOF'\n{{ results.up }}\nEOF", "echo \"$(echo 'a {{ params.p }}')\""],
)
def test_a_substitution_where_bash_expands_nothing_is_refused(command):
    (problem,) = quoting_problems(command)
    assert "where the shell expands nothing" in problem
    with pytest.raises(RenderError, match="where the shell expands nothing"):
        render(command, {"results": {"up": 1}})


def test_a_template_in_a_comment_or_naming_nothing_is_left_as_written():
    command = "echo '{{ nothing }}' # '{{ conf.x }}'\n"
    assert quoting_problems(command) == []
    assert render(command, {"conf": {"x": "v"}}) == Rendered(command, {})


def test_result_references_skip_comments():
    refs = result_references("echo {{ results.a.k }} # {{ results.b }}", ["a"])
    assert [(r.text, r.task_id, r.key) for r in refs] == [("{{ results.a.k }}", "a", "k")]


@pytest.mark.parametrize(
    ("value", "why"),
    [("a\x00b", "NUL"), ("\ud800", "lone surrogate"), ("x" * MAX_ENV_STRING_BYTES, "bytes, over")],
)
def test_a_value_no_environment_can_hold_is_a_render_error_naming_the_template(value, why):
    with pytest.raises(RenderError, match=why) as raised:
        render("echo {{ conf.v }}", {"conf": {"v": value}})
    assert "{{ conf.v }}" in str(raised.value)


def test_values_over_the_total_are_a_render_error():
    command = " ".join(f"{{{{ conf.v{i} }}}}" for i in range(5))
    conf = {f"v{i}": "x" * (MAX_ENV_STRING_BYTES - 100) for i in range(5)}
    with pytest.raises(RenderError, match="in all"):
        render(command, {"conf": conf})


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_reach_bash_as_text_bare_in_double_quotes_and_in_a_heredoc(value, tmp_path):
    context = {"conf": {"v": value}}
    command = (
        "cd " + str(tmp_path) + " && printf '<%s>' a {{ conf.v }} b \"a{{ conf.v }}b\" \"$(printf '[%s]' {{ conf.v }})\""
        " `printf '(%s)' {{ conf.v }} | od -An -c | wc -l` && cat <<EOF\n{{ conf.v }}\nEOF"
    )
    out = bash(render(command, context))
    lines = len(f"({value})".encode()) // 16 + bool(len(f"({value})".encode()) % 16)  # od's lines: one word reached printf
    assert out == f"<a><{value}><b><a{value}b><[{value}]><{lines}>{value}\n"
    assert not (tmp_path / "F").exists()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text().filter(lambda v: "\x00" not in v))
def test_any_text_is_printed_exactly_bare_and_inside_double_quotes(value):
    context = {"conf": {"x": value}}
    assert bash(render("printf '%s' {{ conf.x }}", context)) == value
    assert bash(render("printf '%s' \"a{{ conf.x }}b\"", context)) == "a" + value + "b"
