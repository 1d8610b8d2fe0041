"""orchestrator.foundation.run_params: the one rule for a run's conf, without a database."""
from __future__ import annotations

import pytest

from orchestrator.exceptions import BadRequest
from orchestrator.foundation.run_params import MAX_DEPTH, ParamError, fill_defaults, resolve_conf, task_params
from tests.params.conftest import PARAMS


def refused(conf: object, *, strict: bool = False, params: dict | None = None) -> ParamError:
    with pytest.raises(ParamError) as caught:
        resolve_conf(PARAMS if params is None else params, strict, conf)
    return caught.value


def deep(levels: int) -> object:
    value: object = "x"
    for _ in range(levels):
        value = [value]
    return value


def test_it_fills_missing_params_from_their_defaults():
    """Given values are kept, missing ones take their default, keys it does not declare stay."""
    assert resolve_conf(PARAMS, False, {"mode": "full", "other": [1]}) == {"mode": "full", "other": [1], "team": "data", "day_offset": 1}
    assert resolve_conf(PARAMS, False, {"mode": "full", "team": "ops", "day_offset": 30}) == {"mode": "full", "team": "ops", "day_offset": 30}


def test_it_takes_any_conf_for_a_dag_without_params():
    assert resolve_conf({}, False, None) == {}
    assert resolve_conf(None, False, {"a": {"b": 1}}) == {"a": {"b": 1}}


def test_it_does_not_share_a_default_between_runs():
    """A mutable default is copied: one run's conf changed in place does not change the next."""
    params = {"tags": {"type": "array", "default": ["a"]}}
    first = resolve_conf(params, False, {})
    first["tags"].append("b")
    assert resolve_conf(params, False, {})["tags"] == ["a"]


def test_it_refuses_a_missing_param_without_a_default():
    error = refused({})
    assert error.key == "mode"
    assert error.field == "conf.mode"
    assert str(error) == "conf.mode: is required: the DAG declares this param without a default"
    assert isinstance(error, BadRequest)
    assert error.status == 400


@pytest.mark.parametrize(
    ("conf", "key", "words"),
    [
        ({"mode": "partial"}, "mode", "must be one of ['full', 'incremental'], not 'partial'"),
        ({"mode": "full", "day_offset": 31}, "day_offset", "must be at most 30; got 31"),
        ({"mode": "full", "day_offset": -1}, "day_offset", "must be at least 0; got -1"),
        ({"mode": "full", "day_offset": "3"}, "day_offset", "must be of type integer, not '3'"),
        ({"mode": "full", "day_offset": 1.5}, "day_offset", "must be of type integer, not 1.5"),
        ({"mode": "full", "day_offset": True}, "day_offset", "must be of type integer, not True"),
        ({"mode": "full", "team": None}, "team", "must be of type string, not None"),
        ({"mode": "full", "team": {"a": 1}}, "team", "must be of type string, not {'a': 1}"),
    ],
)
def test_it_refuses_a_value_that_does_not_match_naming_the_key_and_why(conf, key, words):
    error = refused(conf)
    assert error.key == key
    assert str(error) == f"conf.{key}: {words}"


def test_it_names_where_inside_a_value_it_is_wrong():
    params = {"cfg": {"type": "object", "properties": {"rows": {"type": "array", "items": {"type": "integer"}}}}}
    assert str(refused({"cfg": {"rows": [1, "two"]}}, params=params)) == "conf.cfg: rows[1]: must be of type integer, not 'two'"


def test_strict_refuses_a_key_it_does_not_declare():
    error = refused({"mode": "full", "tema": "ops"}, strict=True)
    assert error.key == "tema"
    assert "is not a declared param" in str(error)
    assert "declared: day_offset, mode, team" in str(error)
    assert resolve_conf(PARAMS, True, {"mode": "full"})["team"] == "data"  # declared keys only: fine


def test_it_refuses_a_conf_that_is_not_an_object():
    for conf in ([1], "x", 3):
        with pytest.raises(BadRequest, match="conf must be a JSON object"):
            resolve_conf(PARAMS, False, conf)


# --- hostile values: a clear refusal, never a crash ----------------------------------------------


@pytest.mark.parametrize(("conf", "key"), [({"mode": "fu\x00ll"}, "mode"), ({"x": ["ok", "\udcff"]}, "x"), ({"k\x00": 1}, "k\x00")])
def test_it_refuses_what_no_database_stores(conf, key):
    """NUL and lone surrogates, in a param or any other key, at any depth."""
    error = refused(conf)
    assert error.key == key
    assert "NUL character or a lone surrogate" in str(error)


def test_it_refuses_a_value_nested_too_deeply_for_any_dag():
    """A param's value or any other key, deeper than MAX_DEPTH: refused by name, not by a RecursionError."""
    assert "nested deeper than 64 levels" in str(refused({"mode": "full", "blob": deep(100_000)}))
    assert refused({"mode": "full", "blob": deep(MAX_DEPTH + 1)}, params={}).key == "blob"
    assert resolve_conf({}, False, {"blob": deep(MAX_DEPTH)})["blob"] == deep(MAX_DEPTH)


def test_a_huge_value_gets_a_short_message():
    """A 10 MB string that is too long, or not of the type: the message shows a bounded repr."""
    huge = "y" * 10_000_000
    error = refused({"mode": "full", "team": huge}, params={**PARAMS, "team": {"type": "string", "maxLength": 10}})
    assert error.key == "team"
    assert len(str(error)) < 200
    assert "must have at most this many characters: 10" in str(error)
    error = refused({"mode": huge})
    assert error.key == "mode"
    assert len(str(error)) < 300


def test_a_value_of_many_keys_gets_a_short_message():
    error = refused({"mode": {f"k{i}": i for i in range(100_000)}})
    assert len(str(error)) < 300
    assert str(error).startswith("conf.mode: must be of type string, not {")


def test_a_schema_that_cannot_check_a_value_is_a_refusal_not_a_crash():
    """A reference the schema does not hold (an admin edit could store one): the key is named."""
    params = {"a": {"$ref": "#/$defs/missing"}}
    assert "cannot be checked against its schema" in str(refused({"a": 1}, params=params))


def test_it_never_fetches_a_reference():
    """A remote $ref is never retrieved (an import refuses it; a stored one just fails)."""
    params = {"a": {"$ref": "http://127.0.0.1:9/schema.json"}}
    assert refused({"a": 1}, params=params).key == "a"


# --- what tasks and later runs see ---------------------------------------------------------------


def test_task_params_are_the_declared_params_of_the_conf():
    conf = {"mode": "full", "team": "ops", "day_offset": 2, "other": 1}
    assert task_params(PARAMS, conf) == {"mode": "full", "team": "ops", "day_offset": 2}
    # A param declared after the run was created: its default.
    assert task_params(PARAMS, {"mode": "full"}) == {"mode": "full", "team": "data", "day_offset": 1}
    assert task_params({}, conf) == {}
    assert task_params(None, None) == {}


def test_fill_defaults_checks_nothing():
    assert fill_defaults(PARAMS, {"team": 5}) == {"team": 5, "day_offset": 1}
