"""Pools and circuits in the API: GET /pools, GET /circuits, POST /circuits/NAME/open|close|probe."""
from typing import Annotated, Any

from django.db.models import Sum
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from ninja import Router
from ninja.params.functions import Path
from pydantic import Field

from orchestrator import action_registry, actions
from orchestrator.api.access import Authenticated
from orchestrator.api.inputs import JsonBody, RequestBody, Text
from orchestrator.api.schemas import component, nullable, replies
from orchestrator.documents import iso
from orchestrator.engine import circuits
from orchestrator.exceptions import NotFound
from orchestrator.models import Circuit, Pool, TaskInstance
from retries.circuits import current_state
from retries.states import HOLD_FROM, SLOT_HOLDING_STATES, CircuitState, WaitKind

CHANGE_CIRCUIT = action_registry.CIRCUIT_PERMISSION
INTEGER = {"type": "integer"}
TIME = nullable({"type": "string", "format": "date-time"})

POOL = component(
    "Pool",
    {
        "type": "object",
        "required": ["name", "slots", "description", "used", "waiting"],
        "properties": {
            "name": {"type": "string"},
            "slots": INTEGER,
            "description": {"type": "string"},
            "used": {**INTEGER, "description": "Slots held by queued and running tasks."},
            "waiting": {**INTEGER, "description": "Ready tasks waiting for a slot."},
        },
    },
)
CIRCUIT = component(
    "Circuit",
    {
        "type": "object",
        "required": ["name", "state", "opened_at", "closed_at", "attempts", "failures", "held"],
        "properties": {
            "name": {"type": "string"},
            "state": {"type": "string", "enum": [s.value for s in CircuitState]},
            "opened_at": TIME,
            "closed_at": TIME,
            "attempts": {**INTEGER, "description": "Attempts of its tasks that ended in the window."},
            "failures": {**INTEGER, "description": "Of those, application and timeout failures."},
            "held": {**INTEGER, "description": "Ready tasks the circuit holds."},
        },
    },
)
CircuitName = Annotated[Text, Path(description="The circuit's name (a task's `circuit:`).", example="payments-api")]


class NoteBody(RequestBody):
    note: Annotated[Text, Field(description="Why: kept in the audit log.")] = ""


router = Router()


def _held(kind: WaitKind, name: str) -> int:
    return TaskInstance.objects.filter(
        state__in=HOLD_FROM, waiting_for__kind=str(kind), waiting_for__name=name
    ).count()


def pool_document(pool: Pool) -> dict[str, Any]:
    used = TaskInstance.objects.filter(pool=pool.name, state__in=SLOT_HOLDING_STATES).aggregate(n=Sum("pool_slots"))["n"]
    return {
        "name": pool.name,
        "slots": pool.slots,
        "description": pool.description,
        "used": used or 0,
        "waiting": _held(WaitKind.POOL, pool.name),
    }


def circuit_document(circuit: Circuit) -> dict[str, Any]:
    now = timezone.now()
    count = circuits.window_count(circuit, now)
    state = current_state(CircuitState(circuit.state), circuit.opened_at, now, circuits.settings_for(circuit).cooldown)
    return {
        "name": circuit.name,
        "state": state.value,
        "opened_at": iso(circuit.opened_at),
        "closed_at": iso(circuit.closed_at),
        "attempts": count.attempts,
        "failures": count.failures,
        "held": _held(WaitKind.CIRCUIT, circuit.name),
    }


@router.get(
    "/pools",
    summary="The pools, with the slots in use and the tasks waiting",
    tags=["limits"],
    url_name="pools",
    openapi_extra=replies({200: ("The pools by name.", {"type": "object", "required": ["pools"], "properties": {"pools": {"type": "array", "items": POOL}}})}),
)
def pool_list(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"pools": [pool_document(pool) for pool in Pool.objects.order_by("name")]})


@router.get(
    "/circuits",
    summary="The circuit breakers, with their state and the attempts in their window",
    tags=["limits"],
    url_name="circuits",
    openapi_extra=replies({200: ("The circuits by name.", {"type": "object", "required": ["circuits"], "properties": {"circuits": {"type": "array", "items": CIRCUIT}}})}),
)
def circuit_list(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"circuits": [circuit_document(c) for c in Circuit.objects.order_by("name")]})


CIRCUIT_ACTIONS = {
    "open": "Open the circuit now: hold its tasks until a probe succeeds or it is closed",
    "close": "Close the circuit now: its held tasks are released over its ramp",
    "probe": "Let one task through as a probe now, without waiting for the cool-down",
}


def _add_circuit_action(action: str) -> None:
    def view(request: HttpRequest, name: CircuitName, body: JsonBody[NoteBody]) -> JsonResponse:
        circuit = Circuit.objects.filter(name=name).first()
        if circuit is None:
            raise NotFound(f"no circuit named '{name}'")
        actions.operate_circuit(circuit, action, request.user, note=body.note)
        return JsonResponse(circuit_document(circuit))

    view.__name__ = f"circuit_{action}"
    router.post(
        f"/circuits/{{name}}/{action}",
        summary=CIRCUIT_ACTIONS[action],
        tags=["limits"],
        url_name=f"circuit_{action}",
        auth=Authenticated(CHANGE_CIRCUIT),
        openapi_extra=replies({200: ("The circuit after the action.", CIRCUIT)}),
    )(view)


for _action in CIRCUIT_ACTIONS:
    _add_circuit_action(_action)
