"""GET /api/v1/dead_letters and GET /api/v1/workers: the console's two views of the system as JSON.

The data comes from orchestrator.console (the same functions the pages use); only the
declarations and the shape of the answer live here.
"""
from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from ninja import Router

from orchestrator.api.schemas import component, nullable, replies
from orchestrator.console import deadletters
from orchestrator.console import workers as worker_data

STRING = {"type": "string"}
INTEGER = {"type": "integer"}
MAYBE_TIME = nullable({"type": "string", "format": "date-time"})

router = Router()


def _obj(properties: dict) -> dict:
    return {"type": "object", "required": list(properties), "properties": properties}


INSTANCE_REF = component(
    "TaskInstanceRef",
    _obj({"dag_id": STRING, "run_id": STRING, "task_id": STRING, "map_index": {"type": "integer", "minimum": -1}}),
)
DEAD_LETTER_GROUP = component(
    "DeadLetterGroup",
    {
        **_obj(
            {
                "fingerprint": {**nullable(STRING), "description": "null for dead letters without a fingerprint."},
                "count": INTEGER,
                "sample_error": {**STRING, "description": "The newest failure of the group in one line."},
                "first_seen": MAYBE_TIME,
                "last_seen": MAYBE_TIME,
                "instances": {"type": "array", "items": INSTANCE_REF},
            }
        ),
        "description": "Dead-lettered task instances that failed the same way.",
    },
)
WORKER = component(
    "Worker",
    _obj(
        {
            "name": STRING,
            "hostname": STRING,
            "pid": nullable(INTEGER),
            "queues": {"type": "array", "items": STRING},
            "concurrency": {**INTEGER, "description": "Attempts the worker runs at once (1 unless it says otherwise)."},
            "task_user": {**nullable(STRING), "description": "The user its tasks run as; null: the worker's own user."},
            "spool_error": {**nullable(STRING), "description": "Why its spool could not keep an outcome while the database was away (the outcome was lost and retried as the platform's); null: never."},
            "memory_limits": {
                **nullable({"type": "string", "enum": ["cgroup", "watched"]}),
                "description": "How it enforces tasks' memory_limit: a cgroup per attempt, or watching each attempt's processes.",
            },
            "state": STRING,
            "last_heartbeat": MAYBE_TIME,
            "running": {"type": "array", "items": INSTANCE_REF, "description": "Its queued or running attempts."},
        }
    ),
)


@router.get(
    "/dead_letters",
    summary="Dead-lettered task instances grouped by failure fingerprint, most recently seen first",
    tags=["console"],
    url_name="dead_letters",
    openapi_extra=replies({200: ("The groups.", _obj({"dead_letters": {"type": "array", "items": DEAD_LETTER_GROUP}}))}),
)
def dead_letters(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"dead_letters": [deadletters.document(g) for g in deadletters.groups()]})


@router.get(
    "/workers",
    summary="Every live worker with its queues, concurrency, last heartbeat and running attempts",
    tags=["console"],
    url_name="workers",
    openapi_extra=replies({200: ("The workers by name.", _obj({"workers": {"type": "array", "items": WORKER}}))}),
)
def workers(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"workers": [worker_data.document(w) for w in worker_data.workers()]})
