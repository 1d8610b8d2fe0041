"""The JSON API v1 as one django-ninja application: its operations, errors and OpenAPI document.

Each module of orchestrator.api declares its operations on a ninja `Router` (path, method,
summary, permission through `Authenticated`, parameters and body as typed arguments, its
answer as a model of `api.responses`, which ninja checks); they are added here. The document
at /api/v1/openapi.json is ninja's, generated from those operations, with what this API adds
(`Document`): the error answers each operation can give, its permission, the security
schemes, and the rule that an empty query parameter is an absent one.

Every error is `{"error": "..."}` with the status today's clients expect: a parameter or body
refused is 400 (not ninja's 422), never ninja's `{"detail": ...}`. The body is read by
`access.json_body`, the API's parser.
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
from ninja.parser import Parser

from orchestrator.api import access, alerts, audit, backfill_endpoints, deadline_history, inputs, pools_and_circuits, views, waits, workers_and_dead_letters
from orchestrator.api.responses import Error
from orchestrator.api.routing import ERROR

TITLE = "Orchestrator API"
DESCRIPTION = 'Read DAGs, runs and failures; trigger runs and act on tasks. Errors are JSON: {"error": "..."}.'
REF_PREFIX = "#/components/schemas/"
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


def _permission(operation: Operation) -> str | None:
    """The permission the operation's `access.Authenticated` requires, if any."""
    return next((auth.permission for auth in operation.auth_callbacks if isinstance(auth, access.Authenticated) and auth.permission), None)


class Document(OpenAPISchema):
    """ninja's OpenAPI document, completed with what every operation of this API shares."""

    def operation_details(self, operation: Operation) -> dict[str, Any]:
        details = super().operation_details(operation)
        answers = {str(status): answer for status, answer in details["responses"].items()}
        details["responses"] = {**self.errors(operation, details), **answers}
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
            body["schema"] = self.schemas.get(ref.removeprefix(REF_PREFIX), body["schema"])
        return details

    @staticmethod
    def errors(operation: Operation, details: dict[str, Any]) -> dict[str, Any]:
        """Every error status this operation can answer, with what it means."""
        has_path = any(p["in"] == "path" for p in details["parameters"])
        has_body = "requestBody" in details
        statuses = {401: "No session and no valid bearer token."}
        if details["parameters"] or has_body:
            statuses[400] = "A parameter or the request body is invalid; the error names it."
        permission = _permission(operation)
        if permission or operation.methods != ["GET"]:
            need = f"the permission {permission}" if permission else "nothing more"
            statuses[403] = f"Missing {need}, or (session users) a failed CSRF check."
        if has_path:
            statuses[404] = "No such object."
        if has_body:
            statuses[413] = "The request body is larger than DATA_UPLOAD_MAX_MEMORY_SIZE."
        error = {"content": {"application/json": {"schema": ERROR}}}
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


class JsonObjectParser(Parser):
    """Request bodies as `access.json_body` reads them: a JSON object, NaN and forms refused."""

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        return access.json_body(request)


class Api(NinjaAPI):
    def get_openapi_schema(self, *, path_prefix: str | None = None, path_params: dict[str, Any] | None = None) -> Any:
        document = Document(self, "")
        known = {**document["components"]["schemas"], "Error": Error.model_json_schema(ref_template=REF_PREFIX + "{model}")}
        document["components"] = {"schemas": _referenced(document["paths"], known), "securitySchemes": SECURITY_SCHEMES}
        document["security"] = [{"bearerToken": []}, {"session": []}]
        return document

    def get_openapi_operation_id(self, operation: Operation) -> str:
        """get_dags_dag_id_runs: the method and the path's words, unique as the path is."""
        words = [w for w in re.split(r"[/{}]+", operation.path) if w]
        return "_".join([operation.methods[0].lower(), *words])

    def get_content_type(self) -> str:
        return "application/json"  # as Django's JsonResponse says it (JSON is UTF-8)

    def validation_error_from_error_contexts(self, error_contexts: list[ValidationErrorContext]) -> ValidationError:
        """The first refused value in the API's words (ninja would list pydantic's errors, without the values)."""
        context = error_contexts[0]
        return ValidationError([{"message": inputs.refusal(context.model, context.pydantic_validation_error)}])


api = Api(
    title=TITLE,
    version="1",
    description=DESCRIPTION,
    servers=[{"url": "/api/v1"}],
    urls_namespace="api",
    openapi_url=None,
    docs_url=None,
    auth=access.Authenticated(),
    parser=JsonObjectParser(),
)


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    """ninja's own refusals, and the body the parser refused (ninja answers it as an HttpError
    raised from the parser's exception)."""
    refused = access.error_response(exc.__cause__) if isinstance(exc.__cause__, Exception) else None
    return refused or access.json_error(exc.status_code, exc.message)


@api.exception_handler(Exception)
def _bug(request: HttpRequest, exc: Exception) -> HttpResponse:
    """Anything not the client's doing (a view's answer its model refuses included) is a bug:
    Django's 500 handler answers and logs it (ninja's would show a traceback under DEBUG)."""
    response = access.error_response(exc)
    if response is None:
        raise exc
    return response


api.add_exception_handler(ValidationError, lambda request, exc: access.json_error(400, exc.errors[0]["message"]))
api.add_exception_handler(Http404, lambda request, exc: access.json_error(404, f"no API endpoint at {request.path}"))


@api.get("/openapi.json", summary="This document", tags=["meta"], url_name="openapi", openapi_extra={"responses": {200: {"description": "The OpenAPI 3.1 document of API v1.", "content": {"application/json": {"schema": {"type": "object"}}}}}})
def openapi_view(request: HttpRequest) -> JsonResponse:
    return JsonResponse(document())


@functools.cache
def document() -> dict[str, Any]:
    """The OpenAPI document, built once per process (the operations do not change while it runs)."""
    return dict(api.get_openapi_schema())


ROUTERS = (api.default_router, *(m.router for m in (views, backfill_endpoints, deadline_history, workers_and_dead_letters, pools_and_circuits, audit, alerts, waits)))
for router in ROUTERS[1:]:
    api.add_router("", router)
