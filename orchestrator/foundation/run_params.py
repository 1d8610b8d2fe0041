"""A DAG's run parameters: the one rule for what a run's conf may be, and what its tasks see.

A DAG declares `params`, NAME -> a JSON Schema (draft 2020-12) with an optional `default` and
`description`, and `strict_params`. Every way a run is created (trigger_dag, the API, the
console's form, backfills, the scheduler) calls `resolve_conf` before it creates anything:
missing params are filled from their defaults, each given value is checked against its
schema, (strict) a key that is not a declared param is refused, and (for every DAG) a value
no database can store is refused. A conf typed as text (the commands' --conf, the console's
forms) is read by `conf_from_text`, the API's body by the same JSON reading
(`sanitise.parse_json`), so what is not JSON is refused alike everywhere. The filled conf is what
the run stores; `task_params` is what a task reads as `context["params"]`.

Pure: no Django, no database. jsonschema is imported on first use, so the worker (which only
reads `task_params`) never loads it.
"""
from __future__ import annotations

import copy
import reprlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.exceptions import BadRequest
from orchestrator.foundation.sanitise import NotJson, first_not_finite, first_unstorable, parse_json

if TYPE_CHECKING:
    from jsonschema import ValidationError
    from jsonschema.protocols import Validator

# A conf value nested deeper than this is refused: it would reach the task through the same
# pipes and JSON columns as a result, which are bounded the same way.
MAX_DEPTH = 64
# The keys of a param's declaration that are about the form, not the value.
ANNOTATIONS = ("default", "description")

_BOUNDED = reprlib.Repr()
_BOUNDED.maxlevel, _BOUNDED.maxstring, _BOUNDED.maxother = 3, 60, 60
_BOUNDED.maxtuple = _BOUNDED.maxlist = _BOUNDED.maxdict = _BOUNDED.maxset = 8


def show(value: object, limit: int = 80) -> str:
    """A value as a message shows it: its repr, bounded in depth, width and length, so a huge
    or deeply nested value costs nothing to name."""
    text = _BOUNDED.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ParamError(BadRequest):
    """A conf refused: `key` is the top-level conf key at fault, `field` names it as the API's
    error does (`conf.KEY`), `problem` says why."""

    def __init__(self, key: str, problem: str) -> None:
        self.key, self.problem = key, problem
        self.field = f"conf.{key}"
        super().__init__(f"{self.field}: {problem}")


def validator_for(schema: Mapping[str, Any]) -> Validator:
    """The validator of one param's schema: draft 2020-12, formats asserted, and references
    resolved only inside the schema itself (never fetched from anywhere)."""
    import referencing
    from jsonschema import Draft202012Validator

    return Draft202012Validator(
        schema_of(schema), registry=referencing.Registry(), format_checker=Draft202012Validator.FORMAT_CHECKER
    )


def schema_of(declaration: Mapping[str, Any]) -> dict[str, Any]:
    """A param's declaration without its own `default` (checked apart, so that a default that
    does not match is named as such). `description` is an annotation JSON Schema knows."""
    return {key: value for key, value in declaration.items() if key != "default"}


def depth_of(value: object, limit: int = MAX_DEPTH) -> int:
    """How deeply `value` nests lists and mappings (a scalar is 0), counted up to `limit + 1`;
    iterative, so a deep value cannot exhaust the stack."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (Mapping, list, tuple)):
            level += 1
            deepest = max(deepest, level)
            if level > limit:
                return level
            stack.extend((child, level) for child in (item.values() if isinstance(item, Mapping) else item))
    return deepest


def value_problem(declaration: Mapping[str, Any], value: object) -> str | None:
    """Why `value` does not match the param's schema (naming where, inside the value), or None."""
    if depth_of(value) > MAX_DEPTH:
        return f"is nested deeper than {MAX_DEPTH} levels"
    from jsonschema.exceptions import best_match

    try:
        error = best_match(validator_for(declaration).iter_errors(value))  # type: ignore[arg-type]  # any value: the schema judges it
    except RecursionError:  # a schema that refers to itself without end
        return "cannot be checked: its schema refers to itself without end"
    except Exception as exc:  # a reference the schema does not hold, a bad regex: the schema's fault
        return f"cannot be checked against its schema: {type(exc).__name__}: {str(exc)[:200]}"
    if error is None:
        return None
    inside = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path)
    return (f"{inside[1:] if inside.startswith('.') else inside}: " if inside else "") + describe(error)


def describe(error: ValidationError) -> str:
    """One schema error in a few words, the value shown bounded (jsonschema's own message
    repeats the whole value, however large)."""
    kind, expected, value = error.validator, error.validator_value, error.instance
    if kind == "type":
        kinds = " or ".join(expected) if isinstance(expected, list) else expected
        return f"must be of type {kinds}, not {show(value)}"
    if kind == "enum":
        return f"must be one of {show(expected, 200)}, not {show(value)}"
    if kind == "const":
        return f"must be {show(expected)}, not {show(value)}"
    words = {
        "minimum": "must be at least",
        "maximum": "must be at most",
        "exclusiveMinimum": "must be greater than",
        "exclusiveMaximum": "must be less than",
        "minLength": "must have at least this many characters:",
        "maxLength": "must have at most this many characters:",
        "minItems": "must have at least this many items:",
        "maxItems": "must have at most this many items:",
        "minProperties": "must have at least this many keys:",
        "maxProperties": "must have at most this many keys:",
        "multipleOf": "must be a multiple of",
        "pattern": "must match the pattern",
        "format": "must be in the format",
    }
    if isinstance(kind, str) and kind in words:
        return f"{words[kind]} {show(expected)}; got {show(value)}"
    text = error.message
    return text if len(text) <= 200 else f"{show(value)} does not match its schema ({kind}: {show(expected)})"


def resolve_conf(params: Mapping[str, Any] | None, strict: bool, conf: object) -> dict[str, Any]:
    """The conf a run is created with: `conf` checked against the DAG's params, each missing
    param filled from its default. Raises ParamError naming the first key at fault: a value that
    does not match its schema, a param without a default that is not given, a key that is not a
    declared param (with `strict`), and (for any DAG) a value that cannot be stored (NUL, a lone
    surrogate, NaN or an infinity) or is nested deeper than MAX_DEPTH levels."""
    if conf is None:
        conf = {}
    if not isinstance(conf, Mapping):
        raise BadRequest(f"conf must be a JSON object, not {show(conf)}")
    params = params or {}
    for key, value in conf.items():
        if not isinstance(key, str):
            raise BadRequest(f"conf keys must be strings, not {show(key)}")
        where = first_unstorable({key: value})
        if where is not None:
            raise ParamError(key, f"{where} holds the NUL character or a lone surrogate, which cannot be stored")
        if depth_of(value) > MAX_DEPTH:
            raise ParamError(key, f"is nested deeper than {MAX_DEPTH} levels")
        where = first_not_finite({key: value})
        if where is not None:
            raise ParamError(key, f"{where} is NaN or infinite: JSON has no such number (only finite numbers can be stored)")
    filled = dict(conf)
    for name, declaration in params.items():
        if name in conf:
            problem = value_problem(declaration, conf[name])
            if problem is not None:
                raise ParamError(name, problem)
        elif "default" in declaration:
            filled[name] = copy.deepcopy(declaration["default"])
        else:
            raise ParamError(name, "is required: the DAG declares this param without a default")
    if strict:
        for key in conf:
            if key not in params:
                declared = ", ".join(sorted(params)) or "none"
                raise ParamError(key, f"is not a declared param and the DAG has strict_params (declared: {declared})")
    return filled


def conf_from_text(text: str | None, name: str = "conf") -> Any:
    """A conf typed as JSON text: its value, None when the text is absent or blank. BadRequest
    naming `name` when the text is not JSON (`sanitise.parse_json`: NaN, Infinity, a number too
    large, nesting too deep included). What the value may be is `resolve_conf`'s to say."""
    if text is None or not text.strip():
        return None
    try:
        return parse_json(text)
    except NotJson as exc:
        raise BadRequest(f"{name} is not valid JSON: {exc}") from None


def fill_defaults(params: Mapping[str, Any] | None, conf: Mapping[str, Any] | None) -> dict[str, Any]:
    """`conf` with each param it lacks filled from its default; checks nothing. For a conf
    checked when it was given (a backfill's, before its runs start) and the DAG's params since."""
    filled = dict(conf or {})
    for name, declaration in (params or {}).items():
        if name not in filled and isinstance(declaration, Mapping) and "default" in declaration:
            filled[name] = copy.deepcopy(declaration["default"])
    return filled


def task_params(params: Mapping[str, Any] | None, conf: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a task reads as `context["params"]`: each declared param's value in the run's conf,
    else its default (a param declared after the run was created)."""
    conf = conf if isinstance(conf, Mapping) else {}
    values = {}
    for name, declaration in (params or {}).items():
        if name in conf:
            values[name] = conf[name]
        elif isinstance(declaration, Mapping) and "default" in declaration:
            values[name] = declaration["default"]
    return values


def described(params: Mapping[str, Any] | None) -> Iterator[tuple[str, dict[str, Any]]]:
    """The params by name, for pages and forms: the same order on every database (PostgreSQL's
    jsonb does not keep the order they were written in)."""
    params = params or {}
    for name in sorted(params):
        declaration = params[name]
        yield name, dict(declaration) if isinstance(declaration, Mapping) else {}
