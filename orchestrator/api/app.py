"""The JSON API v1 as one django-ninja application: its operations, errors and OpenAPI document.

Each module of orchestrator.api declares its operations on a ninja `Router` (path, method,
summary, permission through `Authenticated`, parameters and body as typed arguments, its
answers with `schemas.replies`); they are added here. The document at /api/v1/openapi.json
is ninja's, generated from those operations, with what this API adds (`Document`): the error
answers each operation can give, its permission, the security schemes, and the rule that an
empty query parameter is an absent one.

Every error is `{"error": "..."}` with the status today's clients expect: a parameter or body
refused is 400 (not ninja's 422), never ninja's `{"detail": ...}`.
"""
from __future__ import annotations

import functools
import json
import re
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from ninja import NinjaAPI
from ninja.errors import HttpError, ValidationError, ValidationErrorContext
from ninja.openapi.schema import OpenAPISchema
from ninja.operation import Operation

from orchestrator.api import access, alerts, audit, backfills, deadline_history, pools_and_circuits, schemas, views, waits, workers_and_dead_letters

TITLE = "Orchestrator API"
DESCRIPTION = 'Read DAGs, runs and failures; trigger runs and act on tasks. Errors are JSON: {"error": "..."}.'
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
TYPE_NAMES = {
    "string_type": "a string",
    "bool_type": "true or false",
    "int_type": "a whole number",
    "model_type": "a JSON object",
    "dict_type": "a JSON object",
}


def _shown(value: Any) -> str:
    return type(value).__name__ + (f": {value!r:.80}" if isinstance(value, (bool, int, float, str)) else "")


def _where(loc: tuple[Any, ...]) -> str:
    where = ""
    for part in loc:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    return where or "request body"


def _known_fields(model: Any, loc: tuple[Any, ...]) -> str:
    """The fields of the object at `loc` (a body field's parent), for an unknown field's error."""
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        model = getattr(field, "annotation", None)
    fields = getattr(model, "model_fields", {})
    return ", ".join(field.alias or name for name, field in fields.items()) or "none"


def message(error: dict[str, Any], model: Any) -> str:
    """One pydantic error in the API's words, naming the field (e.g. conf.day, map_index)."""
    loc = raw = tuple(error["loc"])
    if getattr(model, "__read_from_single_attr__", None):
        loc = loc[1:]  # the body's own parameter name is not a field of the request
    else:
        loc = model.__ninja_flatten_map_reverse__.get(loc, loc)
    where, kind, value = _where(loc), error["type"], error.get("input")
    ctx = error.get("ctx", {})
    if kind == "missing":
        return f"{where} is required"
    if kind == "extra_forbidden":
        return f"{where} is not a known field (known: {_known_fields(model, raw[:-1])})"
    if kind in TYPE_NAMES:
        return f"{where} must be {TYPE_NAMES[kind]}, got {_shown(value)}"
    if kind in ("literal_error", "enum"):
        return f"{where} must be {ctx.get('expected', 'one of the listed values')}, got {value!r}"
    if kind == "greater_than_equal":
        return f"{where} must be at least {ctx['ge']}, got {value!r}"
    if kind == "less_than_equal":
        return f"{where} must be at most {ctx['le']}, got {value!r}"
    if kind == "value_error":
        return f"{where} {ctx['error']}"
    return f"{where}: {error['msg']}"


def _permission(operation: Operation) -> str | None:
    """The permission the operation's `access.Authenticated` requires, if any."""
    return next((auth.permission for auth in operation.auth_callbacks if isinstance(auth, access.Authenticated) and auth.permission), None)


class Document(OpenAPISchema):
    """ninja's OpenAPI document, completed with what every operation of this API shares."""

    def operation_details(self, operation: Operation) -> dict[str, Any]:
        details = super().operation_details(operation)
        declared = (operation.openapi_extra or {}).get("responses", {})  # ninja's would add a bare 200
        details["responses"] = {**self.errors(operation, details), **declared}
        permission = _permission(operation)
        if permission:
            details["description"] = f"{details.get('description', '')}\n\nNeeds the permission `{permission}`.".strip()
        for parameter in details["parameters"]:
            for said_beside in ("title", "description", "example"):  # the parameter says them
                parameter["schema"].pop(said_beside, None)
            if parameter["in"] == "query":
                # An empty value means "not given", as an HTML form's empty field sends it.
                parameter["allowEmptyValue"] = True
        if "requestBody" in details:  # inline: a client reads the fields where it sends them
            body = details["requestBody"]["content"]["application/json"]
            ref = (body["schema"].get("allOf") or [body["schema"]])[0].get("$ref", "")
            body["schema"] = self.schemas.get(ref.removeprefix(schemas.REF_PREFIX), body["schema"])
        return details

    @staticmethod
    def errors(operation: Operation, details: dict[str, Any]) -> dict[str, Any]:
        """Every error status this operation can answer, with what it means."""
        methods = operation.methods
        has_path = any(p["in"] == "path" for p in details["parameters"])
        has_body = "requestBody" in details
        statuses = {401: "No session and no valid bearer token."}
        if details["parameters"] or has_body:
            statuses[400] = "A parameter or the request body is invalid; the error names it."
        permission = _permission(operation)
        if permission or methods != ["GET"]:
            need = f"the permission {permission}" if permission else "nothing more"
            statuses[403] = f"Missing {need}, or (session users) a failed CSRF check."
        if has_path:
            statuses[404] = "No such object."
        if has_body:
            statuses[413] = "The request body is larger than DATA_UPLOAD_MAX_MEMORY_SIZE."
        error = {"content": {"application/json": {"schema": schemas.ERROR}}}
        return {str(status): {"description": meaning, **error} for status, meaning in sorted(statuses.items())}


def _referenced(paths: dict[str, Any], known: dict[str, Any]) -> dict[str, Any]:
    """The schemas `paths` refer to, directly or through another schema (bodies are inlined)."""
    names: set[str] = set()
    todo = [paths]
    while todo:
        for name in set(re.findall(r'"#/components/schemas/(\w+)"', json.dumps(todo.pop()))) - names:
            names.add(name)
            todo.append(known[name])
    return {name: known[name] for name in sorted(names)}


class Api(NinjaAPI):
    def get_openapi_schema(self, *, path_prefix: str | None = None, path_params: dict[str, Any] | None = None) -> Any:
        document = Document(self, "")
        known = {**document["components"]["schemas"], **schemas.COMPONENTS}
        document["components"] = {"schemas": _referenced(document["paths"], known), "securitySchemes": SECURITY_SCHEMES}
        document["security"] = [{"bearerToken": []}, {"session": []}]
        return document

    def get_openapi_operation_id(self, operation: Operation) -> str:
        """get_dags_dag_id_runs: the method and the path's words, unique as the path is."""
        words = [w for w in re.split(r"[/{}]+", operation.path) if w]
        return "_".join([operation.methods[0].lower(), *words])

    def validation_error_from_error_contexts(self, error_contexts: list[ValidationErrorContext]) -> ValidationError:
        """The first refused value in the API's words (ninja would list pydantic's errors)."""
        context = error_contexts[0]
        error = context.pydantic_validation_error.errors(include_url=False)[0]
        return ValidationError([{"message": message(dict(error), context.model)}])

    def set_default_exception_handlers(self) -> None:  # replaces ninja's {"detail": ...} answers
        """Only the API's JSON errors: anything else is a bug, for Django's 500 handler (and its log)."""
        self.add_exception_handler(ValidationError, lambda request, exc: access.json_error(400, exc.errors[0]["message"]))
        self.add_exception_handler(HttpError, lambda request, exc: access.json_error(exc.status_code, exc.message))
        self.add_exception_handler(Http404, lambda request, exc: access.json_error(404, f"no API endpoint at {request.path}"))
        for kind in access.ERRORS:
            self.add_exception_handler(kind, _error_response)  # type: ignore[arg-type]  # ninja types a handler for one class


def _error_response(request: HttpRequest, exc: Exception) -> HttpResponse:
    response = access.error_response(exc)
    assert response is not None, exc
    return response


api = Api(
    title=TITLE,
    version="1",
    description=DESCRIPTION,
    servers=[{"url": "/api/v1"}],
    urls_namespace="api",
    openapi_url=None,
    docs_url=None,
    auth=access.Authenticated(),
)


@api.get("/openapi.json", summary="This document", tags=["meta"], url_name="openapi", openapi_extra=schemas.replies({200: ("The OpenAPI 3.1 document of API v1.", {"type": "object"})}))
def openapi_view(request: HttpRequest) -> JsonResponse:
    return JsonResponse(document())


@functools.cache
def document() -> dict[str, Any]:
    """The OpenAPI document, built once per process (the operations do not change while it runs)."""
    return dict(api.get_openapi_schema())


ROUTERS = (api.default_router, *(m.router for m in (views, backfills, deadline_history, workers_and_dead_letters, pools_and_circuits, audit, alerts, waits)))
for router in ROUTERS[1:]:
    api.add_router("", router)
