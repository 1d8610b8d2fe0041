"""GET /api/v1/dead_letters and GET /api/v1/workers: the console's two views of the system as JSON.

The data comes from orchestrator.console (the same functions the pages use); only the
declarations and the shape of the answer live here.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from django.http import HttpRequest
from pydantic import Field

from orchestrator.api.responses import Answer, Time
from orchestrator.api.routing import router_answering_as_built
from orchestrator.console import deadletters
from orchestrator.console import workers as worker_data

router = router_answering_as_built()


class TaskInstanceRef(Answer):
    dag_id: str
    run_id: str
    task_id: str
    map_index: Annotated[int, Field(ge=-1)]


class DeadLetterGroup(Answer):
    """Dead-lettered task instances that failed the same way."""

    fingerprint: Annotated[str | None, Field(description="null for dead letters without a fingerprint.")]
    count: int
    sample_error: Annotated[str, Field(description="The newest failure of the group in one line.")]
    first_seen: Time | None
    last_seen: Time | None
    instances: list[TaskInstanceRef]


class RunningTask(Answer):
    dag_id: str
    run_id: str
    task_id: str


class Worker(Answer):
    name: str
    hostname: str
    pid: int | None
    queues: list[str]
    concurrency: Annotated[int, Field(description="Attempts the worker runs at once (1 unless it says otherwise).")]
    task_user: Annotated[str | None, Field(description="The user its tasks run as; null: the worker's own user.")]
    spool_error: Annotated[
        str | None,
        Field(description="Why its spool could not keep an outcome while the database was away (the outcome was lost and retried as the platform's); null: never."),
    ]
    memory_limits: Annotated[
        Literal["cgroup", "watched"] | None,
        Field(description="How it enforces tasks' memory_limit: a cgroup per attempt, or watching each attempt's processes."),
    ]
    state: str
    last_heartbeat: Time | None
    running: Annotated[list[RunningTask], Field(description="Its queued or running attempts.")]


class DeadLetters(Answer):
    dead_letters: list[DeadLetterGroup]


class Workers(Answer):
    workers: list[Worker]


@router.get(
    "/dead_letters",
    summary="Dead-lettered task instances grouped by failure fingerprint, most recently seen first",
    tags=["console"],
    url_name="dead_letters",
    response=DeadLetters,
)
def dead_letters(request: HttpRequest) -> dict[str, Any]:
    return {"dead_letters": [deadletters.document(g) for g in deadletters.groups()]}


@router.get(
    "/workers",
    summary="Every live worker with its queues, concurrency, last heartbeat and running attempts",
    tags=["console"],
    url_name="workers",
    response=Workers,
)
def workers(request: HttpRequest) -> dict[str, Any]:
    return {"workers": [worker_data.document(w) for w in worker_data.workers()]}
