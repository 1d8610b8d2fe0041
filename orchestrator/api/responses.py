"""What the API answers with, as the models ninja checks each answer against and documents.

The views answer with the dicts `orchestrator.operations.documents` (and `api.queries`) build, the ones the
CLI prints too; ninja validates each against its model here before sending it, so a field a
builder adds, drops or retypes fails the tests instead of drifting from the OpenAPI document.
Fields are declared in the order the builders write them (the answer keeps that order), and a
builder's value that is any JSON (a result, a conf, a context's metadata) is `Any`: stored data
is answered as it is, however large or deep.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, GetCoreSchemaHandler, WithJsonSchema
from pydantic_core import CoreSchema, core_schema

from deadlines.models import Deadline as DeadlineRow
from deadlines.models import Reference
from orchestrator.models import DagRun, TaskAttempt
from retries.states import AttemptKind, Category, Reason, RunState, Source, TaskState, TriggerRule


class OneOf:
    """`Annotated[str, OneOf(RunState)]`: a string that is one of these values (an enum in the document)."""

    def __init__(self, values: Iterable[Any]) -> None:
        self.values = [str(value) for value in values]

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.literal_schema(self.values)


Time = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]
JsonObject = dict[str, Any]
MapIndex = Annotated[int, Field(ge=-1, description="-1, or 0..n-1 for an instance of a mapped task.")]


class Answer(BaseModel):
    """An object the API answers with: these fields and no others."""

    model_config = ConfigDict(extra="forbid")


class Error(Answer):
    error: Annotated[str, Field(description="What went wrong, naming the field or value.")]
    field: Annotated[str, Field(description="The field at fault, where one is (e.g. conf.team for a run parameter).")] = ""


class ExecutionContext(Answer):
    """Why an attempt failed: category, reason, who observed it, and details."""

    model_config = ConfigDict(extra="allow")  # stored as the engine wrote it, in any version

    category: Annotated[str, OneOf(Category)]
    reason: Annotated[str, OneOf(Reason)]
    source: Annotated[str, OneOf(Source)]
    metadata: JsonObject = {}
    at: Annotated[Time, Field(description="When a task's last failure was recorded (on a task instance's context).")] = ""


def _checked_context(stored: JsonObject | None) -> JsonObject | None:
    if stored is not None:
        ExecutionContext.model_validate(stored)
    return stored


# A context as stored: checked against ExecutionContext, answered with its keys in their stored order.
Context = Annotated[
    JsonObject | None,
    AfterValidator(_checked_context),
    WithJsonSchema({"anyOf": [ExecutionContext.model_json_schema(), {"type": "null"}]}),
]


class Attempt(Answer):
    try_number: int
    infrastructure_try_number: int
    kind: Annotated[str, OneOf(AttemptKind)]
    state: Annotated[str, OneOf(TaskAttempt.State.values)]
    queued_at: Time | None
    start_date: Time | None
    end_date: Time | None
    context: Context
    hostname: str
    worker_name: str
    pid: int | None
    result: Annotated[Any, Field(description="What the task returned (any JSON value).")]
    stdout: str
    stderr: str
    output_truncated: bool
    resume: Annotated[
        Annotated[str, OneOf(["submitted", "reattached", "already_succeeded", "resubmitted"])] | None,
        Field(description="What a resumable task decided on this attempt, or null."),
    ]
    item: Annotated[
        Any,
        Field(description="The item of its source a mapped task's instance ran with on this attempt (any JSON value); null for a task that is not mapped."),
    ]
    memory_limit_mib: Annotated[int | None, Field(description="The memory limit (MiB) it ran with; null: none.")]
    peak_memory_mib: Annotated[
        int | None,
        Field(description="The most memory (MiB) its processes were seen to use (the failure's peak_mib when it went past its limit); null where not measured."),
    ]
    fingerprint: Annotated[str, Field(description="The failure's fingerprint; absent when it has none.")] = ""


class TaskInstance(Answer):
    task_id: str
    map_index: MapIndex
    state: Annotated[str, OneOf(TaskState)]
    result: Annotated[Any, Field(description="What the task returned once it succeeded (any JSON value; null before).")]
    try_number: int
    max_tries: int
    infrastructure_try_number: int
    infrastructure_retry_limit: int
    next_retry_at: Time | None
    queued_at: Time | None
    start_date: Time | None
    end_date: Time | None
    queue: str
    failure_fingerprint: str | None
    last_failure_context: Context
    waiting_for: Annotated[
        JsonObject | None, Field(description="What a ready task is held by or waits for ({kind, name, ...}), or null.")
    ]
    attempts: list[Attempt]
    task_state: Annotated[JsonObject, Field(description="The task's own key/value store, kept across its attempts.")]


class Deadline(Answer):
    scope: Annotated[str, OneOf(["dag", "task"])]
    task_id: str | None
    reference: Annotated[str, OneOf(Reference.values)]
    need_by: Time | None
    state: Annotated[str, OneOf(DeadlineRow.State.values)]
    callback_state: Annotated[str, OneOf(DeadlineRow.CallbackState.values)] | None


class RunSummary(Answer):
    dag_id: str
    run_id: str
    run_type: Annotated[str, OneOf(DagRun.RunType.values)]
    backfill_id: Annotated[int | None, Field(description="The backfill the run belongs to, or null.")]
    state: Annotated[str, OneOf(RunState)]
    queued_at: Time | None
    start_date: Time | None
    end_date: Time | None
    logical_date: Time | None


class Run(Answer):
    dag_id: str
    run_id: str
    run_type: Annotated[str, OneOf(DagRun.RunType.values)]
    backfill_id: Annotated[int | None, Field(description="The backfill the run belongs to, or null.")]
    state: Annotated[str, OneOf(RunState)]
    conf: JsonObject
    queued_at: Time | None
    start_date: Time | None
    end_date: Time | None
    logical_date: Time | None
    task_instances: list[TaskInstance]
    deadlines: list[Deadline]


class RunList(Answer):
    dag_id: str
    runs: list[RunSummary]


class Task(Answer):
    task_id: str
    upstream: list[str]
    trigger_rule: Annotated[str, OneOf(TriggerRule)]
    python_callable: str | None
    bash_command: str | None
    expand: Annotated[Any, Field(description="A mapped task's {NAME: SOURCE}, or null.")]


class Dag(Answer):
    dag_id: str
    description: str
    schedule: str | None
    timezone: str
    paused: bool
    catchup: bool
    max_active_runs: int
    owner: Annotated[str | None, Field(description="The team that owns the DAG, or null.")]
    next_run_logical_date: Time | None
    params: Annotated[
        dict[str, JsonObject],
        Field(description="The run parameters, as declared: NAME -> a JSON Schema with an optional default and description."),
    ]
    strict_params: Annotated[bool, Field(description="Whether a conf key that is not a declared param is refused.")]
    tasks: list[Task]
    last_run: RunSummary | None


class DagList(Answer):
    dags: list[Dag]


class Failure(Answer):
    dag_id: str
    run_id: str
    task_id: str
    map_index: MapIndex
    try_number: int
    infrastructure_try_number: int
    kind: Annotated[str, OneOf(AttemptKind)]
    context: Context
    fingerprint: str | None
    start_date: Time | None
    end_date: Time | None


class FailureList(Answer):
    count: Annotated[int, Field(description="How many failed attempts match, before the limit.")]
    failures: list[Failure]
