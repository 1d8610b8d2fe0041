"""Request bodies checked against the JSON schema their Operation declares.

Only the part of JSON Schema the API's bodies use: type (one or a list), properties,
required, additionalProperties, propertyNames, enum, pattern; a $ref or anyOf is not
followed (free-form values). Every string and key is checked for NUL whatever the schema
says, since PostgreSQL cannot store it. Errors name the field by its dotted path.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from orchestrator.api.declarations import Schema
from orchestrator.exceptions import BadRequest
from orchestrator.querystring import check_text

TYPE_NAMES = {
    "object": "a JSON object",
    "array": "a JSON array",
    "string": "a string",
    "boolean": "true or false",
    "integer": "a whole number",
    "number": "a number",
    "null": "null",
}


def _is(value: Any, kind: str) -> bool:
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return value is None


def _check_type(value: Any, schema: Schema, where: str) -> None:
    kind = schema.get("type")
    if kind is None:
        return
    kinds = [kind] if isinstance(kind, str) else list(kind)
    if not any(_is(value, k) for k in kinds):
        # null is left out of the wording: it is an "absent" that the schema tolerates.
        expected = " or ".join(TYPE_NAMES[k] for k in kinds if k != "null") or "null"
        shown = type(value).__name__ + (f": {value!r:.80}" if isinstance(value, (bool, int, float, str)) else "")
        raise BadRequest(f"{where} must be {expected}, got {shown}")


def _check_object(value: dict[str, Any], schema: Schema, where: str) -> None:
    properties: Mapping[str, Schema] = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in value:
            raise BadRequest(f"{_join(where, name)} is required")
    extra = schema.get("additionalProperties", True)
    names = schema.get("propertyNames", {})
    for name, item in value.items():
        validate(name, names, f"{where or 'request body'} key {name!r}")
        if name in properties:
            validate(item, properties[name], _join(where, name))
        elif extra is False:
            raise BadRequest(f"{_join(where, name)} is not a known field (known: {', '.join(properties) or 'none'})")
        elif isinstance(extra, Mapping):
            validate(item, extra, _join(where, name))
        else:
            check_no_nul(item, _join(where, name))


def validate(value: Any, schema: Schema, where: str) -> Any:
    """`value` if it matches `schema`; else BadRequest naming `where` (e.g. conf.day)."""
    _check_type(value, schema, where)
    if "enum" in schema and value not in schema["enum"]:
        raise BadRequest(f"{where} must be one of {', '.join(map(repr, schema['enum']))}, got {value!r}")
    if isinstance(value, dict):
        _check_object(value, schema, where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            validate(item, schema.get("items", {}), f"{where}[{index}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise BadRequest(f"{where} must be at least {schema['minimum']}, got {value!r}")
        if "maximum" in schema and value > schema["maximum"]:
            raise BadRequest(f"{where} must be at most {schema['maximum']}, got {value!r}")
    elif isinstance(value, str):
        check_text(where, value)
        if "pattern" in schema and not re.search(schema["pattern"], value):
            raise BadRequest(f"{where} must match {schema['pattern']}, got {value!r:.80}")
    return value


def check_no_nul(value: Any, where: str) -> None:
    """No NUL in any string or key of a free-form JSON value."""
    if isinstance(value, str):
        check_text(where, value)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(f"{where} key {key!r}", key)
            check_no_nul(item, _join(where, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_no_nul(item, f"{where}[{index}]")


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name
