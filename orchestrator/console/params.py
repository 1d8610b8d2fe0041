"""The DAG page's run parameters: the table of what the DAG declares, and the trigger form's
field per param (its description, default and allowed values), read back into a conf.

What a conf may be is decided by `orchestrator.foundation.run_params.resolve_conf` when the run is created;
this module only turns what was typed into JSON values and puts a refusal beside its field.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.exceptions import ActionError, BadRequest
from orchestrator.foundation.run_params import ParamError, conf_from_text, described, schema_of
from orchestrator.foundation.sanitise import NotJson, parse_json

FIELD_PREFIX = "param."  # a param's input is named param.NAME


@dataclass
class ParamField:
    """One param as the page shows it, and as the trigger form asks for it."""

    name: str
    description: str
    schema_text: str  # its schema without default and description, as compact JSON
    has_default: bool
    default_text: str
    # "choice": a <select> of `choices` (enum, or a boolean); "text": taken as typed (a string
    # param); "json": typed as JSON (numbers, objects, lists, anything else).
    kind: str
    choices: list[tuple[str, str]] = field(default_factory=list)  # (the value as JSON, as shown)
    value: str = ""  # what was posted, shown again after a refusal
    error: str = ""

    @property
    def input_name(self) -> str:
        return FIELD_PREFIX + self.name


def as_text(value: Any) -> str:
    """A string as it is, anything else as JSON (what the field is filled in with)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _kind(schema: Mapping[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return "choice", [(json.dumps(v), as_text(v)) for v in enum]
    kind = schema.get("type")
    if kind == "boolean":
        return "choice", [("true", "true"), ("false", "false")]
    if kind == "string":
        return "text", []
    return "json", []


def param_fields(params: Mapping[str, Any] | None, posted: Mapping[str, str] | None = None, error: ActionError | None = None) -> list[ParamField]:
    """A field per declared param, by name; `posted` values kept, `error` beside its param."""
    fields = []
    for name, declaration in described(params):
        kind, choices = _kind(declaration)
        fields.append(
            ParamField(
                name=name,
                description=str(declaration.get("description") or ""),
                schema_text=json.dumps({k: v for k, v in schema_of(declaration).items() if k != "description"}, sort_keys=True),
                has_default="default" in declaration,
                default_text=as_text(declaration.get("default")),
                kind=kind,
                choices=choices,
                value=(posted or {}).get(name, ""),
                error=error.problem if isinstance(error, ParamError) and error.key == name else "",
            )
        )
    return fields


def is_beside_a_field(params: Mapping[str, Any] | None, error: ActionError) -> bool:
    """Whether the form shows `error` beside a param's field rather than above the form."""
    return isinstance(error, ParamError) and error.key in (params or {})


def posted_values(params: Mapping[str, Any] | None, data: Mapping[str, str]) -> dict[str, str]:
    """What the form posted for each declared param (by name)."""
    return {name: data.get(FIELD_PREFIX + name, "") for name in (params or {})}


def conf_from_form(params: Mapping[str, Any] | None, conf_text: str, posted: Mapping[str, str]) -> dict[str, Any] | None:
    """The conf the form asks for: its JSON text, with each param field that was filled in over
    it (an empty field: the key is not given, so its default applies). BadRequest for JSON
    that does not parse, naming the field (a param's: ParamError)."""
    conf = conf_from_text(conf_text)
    typed: dict[str, Any] = {}
    for name, declaration in described(params):
        text = posted.get(name, "")
        if text == "":
            continue
        kind, _ = _kind(declaration)
        if kind == "text":
            typed[name] = text
            continue
        try:
            typed[name] = parse_json(text)
        except NotJson as exc:
            raise ParamError(name, f"is not valid JSON ({exc}); write a string in double quotes") from None
    if not typed:
        return conf
    if conf is not None and not isinstance(conf, dict):
        raise BadRequest(f"conf must be a JSON object, got {type(conf).__name__}")
    return {**(conf or {}), **typed}
