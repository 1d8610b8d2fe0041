"""Validation of a DAG's `params` and `strict_params` (its run parameters).

Each param is NAME: a JSON Schema (draft 2020-12) with an optional `default` and
`description`. Its schema must be a valid one, its default must match it, and it may refer
only to itself (`$ref: "#/..."`): nothing is fetched. A DAG with a schedule cannot have a
param without a default, since a scheduled run has only the defaults. Called by
`schema.validate_dag` for files and the admin alike; what a run's conf may be is
`orchestrator.foundation.run_params.resolve_conf`.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from orchestrator.foundation.run_params import MAX_DEPTH, depth_of, schema_of, value_problem
from orchestrator.specs.value_checks import Problems, is_jsonable, join, show

# A param's name is a conf key and a template's `{{ params.NAME }}`: no dots, no spaces.
PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,99}$")
REFERENCE_KEYS = ("$ref", "$dynamicRef")


def check_params(raw: object, strict: object, schedule: object, problems: Problems) -> tuple[dict[str, Any], bool]:
    """`params` and `strict_params` normalised; every problem added under `params.NAME` or
    `strict_params`."""
    if not isinstance(strict, bool):
        problems.add("strict_params", f"must be true or false, not {show(strict)}")
        strict = False
    if raw is None:
        return {}, strict
    if not isinstance(raw, Mapping):
        problems.add("params", f"must be a mapping of param names to JSON Schemas, not {show(raw)}")
        return {}, strict
    params: dict[str, Any] = {}
    for name, declaration in raw.items():
        path = join("params", str(name))
        if not isinstance(name, str) or not PARAM_NAME.match(name):
            problems.add("params", f"param name {show(name)} must be 1-100 letters, digits, '_' or '-', not starting with a digit or '-'")
            continue
        if _check_param(declaration, path, problems):
            params[name] = dict(declaration)
            if schedule and "default" not in declaration:
                problems.add(path, "has no default, so the DAG cannot have a schedule: a scheduled run has only the defaults")
    return params, strict


def _check_param(declaration: object, path: str, problems: Problems) -> bool:
    """Whether one param's declaration is usable; its problems added under `path`."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if not isinstance(declaration, Mapping):
        problems.add(path, f"must be a JSON Schema mapping such as {{type: string, default: x}}, not {show(declaration)}")
        return False
    if depth_of(declaration) > MAX_DEPTH:
        problems.add(path, f"is nested deeper than {MAX_DEPTH} levels")
        return False
    if not is_jsonable(declaration):
        problems.add(path, "must hold only JSON values (strings, numbers, booleans, null, lists, mappings)")
        return False
    description = declaration.get("description")
    if description is not None and not isinstance(description, str):
        problems.add(join(path, "description"), f"must be a string, not {show(description)}")
        return False
    outside = _outside_references(declaration)
    if outside is not None:
        problems.add(path, f"refers outside its own schema ({show(outside)}): only references starting with '#' are allowed")
        return False
    try:
        Draft202012Validator.check_schema(schema_of(declaration))
    except SchemaError as exc:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.absolute_path)
        message = exc.message if len(exc.message) <= 200 else exc.message[:197] + "..."
        problems.add(path + where, f"is not a valid JSON Schema (draft 2020-12): {message}")
        return False
    except RecursionError:
        problems.add(path, "is not a valid JSON Schema: it nests too deeply")
        return False
    if "default" in declaration:
        problem = value_problem(declaration, declaration["default"])
        if problem is not None:
            problems.add(join(path, "default"), f"does not match the param's own schema: {problem}")
            return False
    return True


def _outside_references(schema: object) -> object:
    """The first `$ref` or `$dynamicRef` that does not point inside the schema, or None."""
    stack = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            for key, value in item.items():
                if key in REFERENCE_KEYS and not (isinstance(value, str) and value.startswith("#")):
                    return value
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
    return None
