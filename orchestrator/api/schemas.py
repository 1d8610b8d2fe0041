"""JSON schemas of the documents the API answers with (orchestrator.documents, api.queries).

The views answer with the documents orchestrator.documents builds (a JsonResponse, never
re-serialised), so these schemas describe them for the OpenAPI document only: each view names
its answers with `replies()`. Enumerations come from retries.states, so a new state is
documented the moment it exists. Objects list the fields every answer has; clients should
ignore fields they do not know.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from deadlines.models import Deadline, Reference
from orchestrator.models import DagRun, TaskAttempt
from retries.states import AttemptKind, Category, Reason, RunState, Source, TaskState, TriggerRule

Schema = Mapping[str, Any]
REF_PREFIX = "#/components/schemas/"
COMPONENTS: dict[str, Schema] = {}


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


def replies(answers: Mapping[int, tuple[str, Schema]], errors: Mapping[int, str] | None = None) -> dict[str, Any]:
    """An operation's `openapi_extra`: its answers {status: (description, schema)} and the errors
    only it gives {status: meaning} (e.g. 409).

    A schema is the JSON body's, or {media type: schema} when there are several. The errors every
    operation of its kind gives (401, 400, 403, 404, 413) are added by app.Document.
    """
    responses: dict[str, Any] = {}
    for status, (description, schema) in answers.items():
        by_media = schema if schema and all("/" in key for key in schema) else {"application/json": schema}
        responses[str(status)] = {"description": description, "content": {m: {"schema": dict(s)} for m, s in by_media.items()}}
    for status, meaning in (errors or {}).items():
        responses[str(status)] = {"description": meaning, "content": {"application/json": {"schema": ERROR}}}
    return {"responses": responses}


STRING = {"type": "string"}
INTEGER = {"type": "integer"}
BOOLEAN = {"type": "boolean"}
TIME = {"type": "string", "format": "date-time"}
MAYBE_TIME = nullable(TIME)
ANY_OBJECT = {"type": "object"}


def enum(values: Any) -> dict[str, Any]:
    return {"type": "string", "enum": [str(v) for v in values]}


def obj(properties: dict[str, Schema], *, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """An object whose properties are all present, except the `optional` ones."""
    return {"type": "object", "required": [p for p in properties if p not in optional], "properties": properties}


ERROR = component(
    "Error",
    obj(
        {
            "error": {"type": "string", "description": "What went wrong, naming the field or value."},
            "field": {"type": "string", "description": "The field at fault, where one is (e.g. conf.team for a run parameter)."},
        },
        optional=("field",),
    ),
)

CONTEXT = component(
    "ExecutionContext",
    {
        **obj(
            {"category": enum(Category), "reason": enum(Reason), "source": enum(Source), "metadata": ANY_OBJECT},
            optional=("metadata",),
        ),
        "description": "Why an attempt failed: category, reason, who observed it, and details.",
    },
)
MAYBE_CONTEXT = {"anyOf": [CONTEXT, {"type": "null"}]}

ATTEMPT = component(
    "Attempt",
    obj(
        {
            "try_number": INTEGER,
            "infrastructure_try_number": INTEGER,
            "kind": enum(AttemptKind),
            "state": enum(TaskAttempt.State.values),
            "queued_at": MAYBE_TIME,
            "start_date": MAYBE_TIME,
            "end_date": MAYBE_TIME,
            "context": MAYBE_CONTEXT,
            "hostname": STRING,
            "worker_name": STRING,
            "pid": nullable(INTEGER),
            "result": {"description": "What the task returned (any JSON value)."},
            "stdout": STRING,
            "stderr": STRING,
            "output_truncated": BOOLEAN,
            "resume": {
                "anyOf": [{"type": "string", "enum": ["submitted", "reattached", "already_succeeded", "resubmitted"]}, {"type": "null"}],
                "description": "What a resumable task decided on this attempt, or null.",
            },
            "item": {
                "description": "The item of its source a mapped task's instance ran with on this attempt (any JSON value); null for a task that is not mapped."
            },
            "memory_limit_mib": {**nullable(INTEGER), "description": "The memory limit (MiB) it ran with; null: none."},
            "peak_memory_mib": {
                **nullable(INTEGER),
                "description": "The most memory (MiB) its processes were seen to use (the failure's peak_mib when it went past its limit); null where not measured.",
            },
            "fingerprint": STRING,
        },
        optional=("fingerprint",),
    ),
)

TASK_INSTANCE = component(
    "TaskInstance",
    obj(
        {
            "task_id": STRING,
            "map_index": {"type": "integer", "minimum": -1, "description": "-1, or 0..n-1 for an instance of a mapped task."},
            "state": enum(TaskState),
            "result": {"description": "What the task returned once it succeeded (any JSON value; null before)."},
            "try_number": INTEGER,
            "max_tries": INTEGER,
            "infrastructure_try_number": INTEGER,
            "infrastructure_retry_limit": INTEGER,
            "next_retry_at": MAYBE_TIME,
            "queued_at": MAYBE_TIME,
            "start_date": MAYBE_TIME,
            "end_date": MAYBE_TIME,
            "queue": STRING,
            "failure_fingerprint": nullable(STRING),
            "last_failure_context": MAYBE_CONTEXT,
            "attempts": {"type": "array", "items": ATTEMPT},
            "task_state": {
                "type": "object",
                "additionalProperties": True,
                "description": "The task's own key/value store, kept across its attempts.",
            },
        }
    ),
)

DEADLINE = component(
    "Deadline",
    obj(
        {
            "scope": enum(["dag", "task"]),
            "task_id": nullable(STRING),
            "reference": enum(Reference.values),
            "need_by": MAYBE_TIME,
            "state": enum(Deadline.State.values),
            "callback_state": nullable(enum(Deadline.CallbackState.values)),
        }
    ),
)

_RUN_FIELDS: dict[str, Schema] = {
    "dag_id": STRING,
    "run_id": STRING,
    "run_type": enum(DagRun.RunType.values),
    "backfill_id": {**nullable(INTEGER), "description": "The backfill the run belongs to, or null."},
    "state": enum(RunState),
    "queued_at": MAYBE_TIME,
    "start_date": MAYBE_TIME,
    "end_date": MAYBE_TIME,
    "logical_date": MAYBE_TIME,
}
RUN_SUMMARY = component("RunSummary", obj(_RUN_FIELDS))
RUN = component(
    "Run",
    obj(
        {
            **_RUN_FIELDS,
            "conf": ANY_OBJECT,
            "task_instances": {"type": "array", "items": TASK_INSTANCE},
            "deadlines": {"type": "array", "items": DEADLINE},
        }
    ),
)
RUN_LIST = component("RunList", obj({"dag_id": STRING, "runs": {"type": "array", "items": RUN_SUMMARY}}))

TASK = component(
    "Task",
    obj(
        {
            "task_id": STRING,
            "upstream": {"type": "array", "items": STRING},
            "trigger_rule": enum(TriggerRule),
            "python_callable": nullable(STRING),
            "bash_command": nullable(STRING),
            "expand": {"description": "A mapped task's {NAME: SOURCE}, or null."},
        }
    ),
)
DAG = component(
    "Dag",
    obj(
        {
            "dag_id": STRING,
            "description": STRING,
            "schedule": nullable(STRING),
            "timezone": STRING,
            "paused": BOOLEAN,
            "catchup": BOOLEAN,
            "max_active_runs": INTEGER,
            "owner": {**nullable(STRING), "description": "The team that owns the DAG, or null."},
            "next_run_logical_date": MAYBE_TIME,
            "params": {
                "type": "object",
                "additionalProperties": {"type": "object"},
                "description": "The run parameters, as declared: NAME -> a JSON Schema with an optional default and description.",
            },
            "strict_params": {**BOOLEAN, "description": "Whether a conf key that is not a declared param is refused."},
            "tasks": {"type": "array", "items": TASK},
            "last_run": {"anyOf": [RUN_SUMMARY, {"type": "null"}]},
        }
    ),
)
DAG_LIST = component("DagList", obj({"dags": {"type": "array", "items": DAG}}))

FAILURE = component(
    "Failure",
    obj(
        {
            "dag_id": STRING,
            "run_id": STRING,
            "task_id": STRING,
            "map_index": {"type": "integer", "minimum": -1, "description": "-1, or the instance of a mapped task."},
            "try_number": INTEGER,
            "infrastructure_try_number": INTEGER,
            "kind": enum(AttemptKind),
            "context": MAYBE_CONTEXT,
            "fingerprint": nullable(STRING),
            "start_date": MAYBE_TIME,
            "end_date": MAYBE_TIME,
        }
    ),
)
FAILURE_LIST = component(
    "FailureList",
    obj(
        {
            "count": {"type": "integer", "description": "How many failed attempts match, before the limit."},
            "failures": {"type": "array", "items": FAILURE},
        }
    ),
)
