"""GET /api/v1/openapi.json: the OpenAPI 3.1 document, built from the declared operations.

Nothing here is written by hand per endpoint: paths, parameters, bodies and responses all
come from the `Operation` each view is declared with (api.declarations).
"""
from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse

from orchestrator.api import schemas
from orchestrator.api.declarations import COMPONENTS, OPERATIONS, PATH_PARAMETERS, Operation, Reply
from orchestrator.api.decorators import endpoint
from orchestrator.querystring import TEXT

METHOD_ORDER = ("GET", "POST", "PUT", "PATCH", "DELETE")
SECURITY_SCHEMES = {
    "bearerToken": {
        "type": "http",
        "scheme": "bearer",
        "description": "A token from `python manage.py create_api_token USERNAME`.",
    },
    "session": {
        "type": "apiKey",
        "in": "cookie",
        "name": "sessionid",
        "description": "A logged-in browser session; requests that change something also need the CSRF token.",
    },
}


def _parameters(operation: Operation) -> list[dict[str, Any]]:
    described = {**PATH_PARAMETERS, **operation.path_parameters}
    path = [
        {"name": name, "in": "path", "required": True, **described.get(name, {}), "schema": dict(TEXT)}
        for name in operation.path_params
    ]
    # An empty value means "not given", as an HTML form's empty field sends it.
    query = [
        {"name": p.name, "in": "query", "required": False, "allowEmptyValue": True, "description": p.description, "schema": dict(p.schema)}
        for p in operation.query
    ]
    return path + query


def _reply(reply: Reply) -> dict[str, Any]:
    content = {media: {"schema": schema} for media, schema in reply.content.items()}
    return {"description": reply.description, **({"content": content} if content else {})}


def _operation(operation: Operation) -> dict[str, Any]:
    description = operation.description
    if operation.permission:
        description = f"{description}\n\nNeeds the permission `{operation.permission}`.".strip()
    responses = {str(status): _reply(reply) for status, reply in operation.ok.items()}
    for status, meaning in sorted(operation.error_statuses().items()):
        responses[str(status)] = _reply(Reply.json(meaning, schemas.ERROR))
    doc: dict[str, Any] = {
        "operationId": operation.operation_id,
        "summary": operation.summary,
        **({"description": description} if description else {}),
        **({"tags": [operation.tag]} if operation.tag else {}),
        "parameters": _parameters(operation),
        "responses": responses,
    }
    if operation.body is not None:
        doc["requestBody"] = {"required": False, "content": {"application/json": {"schema": dict(operation.body)}}}
    return doc


def document() -> dict[str, Any]:
    """The whole OpenAPI document of every registered operation."""
    paths: dict[str, dict[str, Any]] = {}
    ordered = sorted(OPERATIONS.values(), key=lambda op: (op.path, METHOD_ORDER.index(op.method)))
    for operation in ordered:
        paths.setdefault(operation.path, {})[operation.method.lower()] = _operation(operation)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Orchestrator API",
            "version": "1",
            "description": "Read DAGs, runs and failures; trigger runs and act on tasks. Errors are JSON: {\"error\": \"...\"}.",
        },
        "servers": [{"url": "/api/v1"}],
        "security": [{"bearerToken": []}, {"session": []}],
        "paths": paths,
        "components": {"schemas": dict(sorted(COMPONENTS.items())), "securitySchemes": SECURITY_SCHEMES},
    }


@endpoint(
    Operation(
        "GET",
        "/openapi.json",
        "This document",
        {200: Reply.json("The OpenAPI 3.1 document of API v1.", {"type": "object"})},
        tag="meta",
    )
)
def openapi_view(request: HttpRequest) -> JsonResponse:
    return JsonResponse(document())
