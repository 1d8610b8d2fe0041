"""What the API's operations take, as pydantic types django-ninja validates and documents.

- Path parameters are `Text`: a string without NUL (PostgreSQL can neither store nor compare it).
- Query parameters are `querystring.Param`s, the declarations the console's pages read too:
  `query_model` turns them into the model an operation takes, so a parameter is parsed, and
  refused with the same message, whichever interface reads it.
- A JSON body is a `RequestBody`: no field but the declared ones (a typo is an error), no
  coercion ("5" is not a number, 1 is not true), no NUL in any string or key at any depth.
  `access.json_body` reads it (the API's parser): NaN, a form or a non-object are refused. No
  body is `{}` where no field is required (`body: X = X.EMPTY`), else refused naming the field.

A value a declaration refuses is a 400 `{"error": "..."}` naming the field and the value
(`refusal` words pydantic's errors; the checks here raise BadRequest themselves).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, ClassVar

from ninja import Schema
from ninja.params.functions import Path
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictStr, ValidationInfo, WithJsonSchema, create_model
from pydantic import ValidationError as Refused

from orchestrator.exceptions import BadRequest
from orchestrator.foundation.querystring import NO_NUL, Param, check_text


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain the NUL character (\\u0000)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogate such as \\ud800)") from None
    return value


Text = Annotated[StrictStr, AfterValidator(_no_nul), WithJsonSchema({"type": "string", "pattern": NO_NUL})]


# Path parameters, each with an example the document's tests (Schemathesis) can call.
DagId = Annotated[Text, Path(description="The DAG's id.", example="etl")]
RunId = Annotated[Text, Path(description="The run's id.", example="manual__2026-01-01T00:00:00+00:00")]
TaskId = Annotated[Text, Path(description="The task's id within its DAG.", example="extract")]


def check_no_nul(value: Any, where: str) -> None:
    """No NUL in any string or key of a free-form JSON value (a 400 naming where it is)."""
    if isinstance(value, str):
        check_text(where, value)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(f"{where} key {key!r}", key)
            check_no_nul(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_no_nul(item, f"{where}[{index}]")


def _object_or_null(value: Any, info: ValidationInfo) -> Any:
    name = info.field_name or "value"
    if value is not None and not isinstance(value, dict):
        raise BadRequest(f"{name} must be a JSON object, got {type(value).__name__}")
    check_no_nul(value, name)
    return value


# A free-form JSON object or null (e.g. a run's conf), NUL-free throughout. The schema is not
# recursive on purpose: JSON Schema can say "no NUL at any depth" only by recursion, which test
# generators handle badly; the rule is stated here and enforced by `_object_or_null`.
JsonObject = Annotated[
    dict[str, Any] | None,
    BeforeValidator(_object_or_null),
    WithJsonSchema(
        {
            "type": ["object", "null"],
            "propertyNames": {"type": "string", "pattern": NO_NUL},
            "additionalProperties": {"description": "Any JSON value. No string or key in it, at any depth, may hold NUL (\\u0000): that is a 400."},
        }
    ),
]


class FieldError(BadRequest):
    """A refused body field, named in the answer's `"field"` as well as in its message."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


def _text_or_null(value: Any, info: ValidationInfo) -> Any:
    """A string (without NUL) or null; else a 400 naming the field, as the engine's own
    refusal of the text does."""
    name = info.field_name or "value"
    if value is not None and not isinstance(value, str):
        raise FieldError(name, f"{name} must be an ISO 8601 date or date-time string, not {type(value).__name__}: {value!r:.80}")
    if value is not None:
        try:
            _no_nul(value)
        except ValueError as exc:
            raise FieldError(name, f"{name} {exc}") from None
    return value


# A date or date-time as ISO 8601 text (a run's logical date), or null; what it means is the
# engine's to decide (`engine.run_creation.parse_logical_date`: naive in the DAG's timezone).
LogicalDate = Annotated[
    str | None,
    BeforeValidator(_text_or_null),
    WithJsonSchema({"type": ["string", "null"], "pattern": NO_NUL, "anyOf": [{"format": "date-time"}, {"format": "date"}]}),
]


class RequestBody(Schema):
    """A JSON request body: these optional fields and no others, each of exactly its type."""

    model_config = ConfigDict(extra="forbid", strict=True)
    # The body as {}, for `body: X = X.EMPTY` (ninja passes the default when no body is sent);
    # a body with a required field has none, and no body is refused naming that field.
    EMPTY: ClassVar[Any]

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        try:
            cls.EMPTY = cls()
        except Refused:
            pass


def query_model(name: str, params: Iterable[Param]) -> type[Schema]:
    """The query parameters `params` as one model (an operation takes it as `Query[...]`)."""
    fields: dict[str, Any] = {}
    for param in params:
        schema = {**param.schema, "description": param.description}
        kind = Annotated[Any, BeforeValidator(param.parse), WithJsonSchema(schema)]
        # The document shows the parameter's own schema: pydantic would add the absent value.
        fields[param.name] = (kind, Field(param.default, json_schema_extra=_as_declared(schema)))
    return create_model(name, __base__=Schema, **fields)


def given(query: Any) -> dict[str, Any]:
    """The values of a `query_model` model (its fields are made at run time: no attributes to type)."""
    return dict(query.model_dump())


def _as_declared(declared: dict[str, Any]) -> Any:
    def keep(schema: dict[str, Any]) -> None:
        for key in set(schema) - set(declared):
            del schema[key]

    return keep


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


def _model_of(model: Any, name: Any) -> Any:
    """The model a field of `model` holds, if it holds one."""
    field = model.model_fields.get(name) if isinstance(model, type) and issubclass(model, BaseModel) else None
    held = field.annotation if field is not None else None
    return held if isinstance(held, type) and issubclass(held, BaseModel) else None


def refusal(model: type[BaseModel], refused: Refused) -> str:
    """The first error of ninja's model of an operation's parameters (`model`), in the API's words,
    naming the field (e.g. conf.day, map_index) as the request wrote it."""
    error = refused.errors(include_url=False)[0]
    loc = tuple(error["loc"])
    fields_of = _model_of(model, loc[0]) if loc else None
    if fields_of is None:  # a path parameter: the loc is its name
        fields_of = model
    else:  # a body or a query model: the loc goes on with its fields
        loc = loc[1:]
    if not loc and error["type"] == "missing":  # no body: refused as an empty object would be
        try:
            fields_of.model_validate({})
        except Refused as empty:
            error = empty.errors(include_url=False)[0]
            loc = tuple(error["loc"])
    return message(dict(error), loc, fields_of)


def message(error: dict[str, Any], loc: tuple[Any, ...], model: Any) -> str:
    """One pydantic error at `loc` of `model` in the API's words."""
    where, kind, value = _where(loc), error["type"], error.get("input")
    ctx = error.get("ctx", {})
    if kind == "missing":
        return f"{where} is required"
    if kind == "extra_forbidden":
        for part in loc[:-1]:
            model = _model_of(model, part)
        fields = getattr(model, "model_fields", {})
        return f"{where} is not a known field (known: {', '.join(f.alias or name for name, f in fields.items()) or 'none'})"
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
