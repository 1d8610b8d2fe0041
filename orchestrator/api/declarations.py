"""What each API endpoint takes and answers, declared once.

An `Operation` (method, path, parameters, request body schema, responses) is given to
`decorators.endpoint`, which registers it here and validates every request with it;
`openapi.document()` describes the same registry. A declaration therefore cannot drift from
what is served: the view that would drift is the one reading it.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from orchestrator.querystring import TEXT, Param

Schema = Mapping[str, Any]
REF_PREFIX = "#/components/schemas/"
PATH_PARAMETER = re.compile(r"\{([a-z_]+)\}")
# Path parameters shared by many paths (OpenAPI parameter fields); an Operation may add its own.
PATH_PARAMETERS: dict[str, dict[str, str]] = {
    "dag_id": {"description": "The DAG's id.", "example": "etl"},
    "run_id": {"description": "The run's id.", "example": "manual__2026-01-01T00:00:00+00:00"},
    "task_id": {"description": "The task's id within its DAG.", "example": "extract"},
}

COMPONENTS: dict[str, Schema] = {}
OPERATIONS: dict[tuple[str, str], Operation] = {}


def component(name: str, schema: Schema) -> dict[str, str]:
    """Name a schema once (it becomes components/schemas/NAME) and return a reference to it."""
    if COMPONENTS.setdefault(name, schema) != schema:
        raise ImproperlyConfigured(f"two different API schemas are named {name!r}")
    return {"$ref": REF_PREFIX + name}


def nullable(schema: Schema) -> dict[str, Any]:
    """`schema` or null (OpenAPI 3.1: a list of types)."""
    kind = schema.get("type")
    if kind is None:
        return {"anyOf": [dict(schema), {"type": "null"}]}
    kinds = [kind] if isinstance(kind, str) else list(kind)
    widened: dict[str, Any] = {**schema, "type": [*kinds, "null"]}
    if "enum" in schema:  # enum applies whatever the type: null must be listed too
        widened["enum"] = [*schema["enum"], None]
    return widened


# --- operations ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """One documented response: a description and its body's schema by media type."""

    description: str
    content: Mapping[str, Schema] = field(default_factory=dict)

    @classmethod
    def json(cls, description: str, schema: Schema) -> Reply:
        return cls(description, {"application/json": schema})


@dataclass(frozen=True)
class Operation:
    """One method on one path under /api/v1 (`path` is an OpenAPI template: /dags/{dag_id})."""

    method: str
    path: str
    summary: str
    ok: Mapping[int, Reply]
    query: tuple[Param, ...] = ()
    body: Schema | None = None
    permission: str | None = None
    errors: Mapping[int, str] = field(default_factory=dict)
    description: str = ""
    path_parameters: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    tag: str = ""

    @property
    def path_params(self) -> list[str]:
        return PATH_PARAMETER.findall(self.path)

    @property
    def operation_id(self) -> str:
        words = [w for w in re.split(r"[/{}]+", self.path) if w]
        return "_".join([self.method.lower(), *words])

    def error_statuses(self) -> dict[int, str]:
        """Every error status this operation can answer, with what it means."""
        statuses = {401: "No session and no valid bearer token."}
        if self.query or self.body is not None or self.path_params:
            statuses[400] = "A parameter or the request body is invalid; the error names it."
        if self.permission or self.method != "GET":
            need = f"the permission {self.permission}" if self.permission else "nothing more"
            statuses[403] = f"Missing {need}, or (session users) a failed CSRF check."
        if self.path_params:
            statuses[404] = "No such object."
        if self.body is not None:
            statuses[413] = "The request body is larger than DATA_UPLOAD_MAX_MEMORY_SIZE."
        return {**statuses, **self.errors}


def register(operation: Operation) -> None:
    key = (operation.method, operation.path)
    if OPERATIONS.setdefault(key, operation) is not operation:
        raise ImproperlyConfigured(f"API operation {operation.method} {operation.path} is declared twice")


# Not recursive on purpose: JSON Schema can say "no NUL at any depth" only by recursion, which
# test generators handle badly; the rule is stated here and enforced by validation.
JSON_VALUE = component(
    "JsonValue",
    {"description": "Any JSON value. No string or key in it, at any depth, may hold NUL (\\u0000): that is a 400."},
)


def json_object(description: str, *, allow_null: bool = False) -> dict[str, Any]:
    """A free-form JSON object (e.g. a run's conf), NUL-free throughout."""
    kind: Any = ["object", "null"] if allow_null else "object"
    return {"type": kind, "propertyNames": TEXT, "additionalProperties": JSON_VALUE, "description": description}


def request_body(properties: Mapping[str, Schema]) -> dict[str, Any]:
    """A request body: a JSON object with these optional fields and no others (a typo is an error)."""
    return {"type": "object", "properties": dict(properties), "additionalProperties": False}
