"""Pools and circuits in the API: GET /pools, GET /circuits, POST /circuits/NAME/open|close|probe."""
from typing import Annotated, Any

from django.db.models import Sum
from django.http import HttpRequest
from django.utils import timezone
from ninja.params.functions import Path
from pydantic import Field

from orchestrator.api.inputs import RequestBody, Text
from orchestrator.api.responses import Answer, OneOf, Time
from orchestrator.api.routing import add_actions, router_answering_as_built
from orchestrator.engine import circuits
from orchestrator.exceptions import NotFound
from orchestrator.models import Circuit as CircuitRow
from orchestrator.models import Pool as PoolRow
from orchestrator.models import TaskInstance
from orchestrator.operations import actions
from orchestrator.operations.action_registry import CIRCUIT_ACTIONS, CIRCUIT_NOTE, CircuitAction
from orchestrator.operations.documents import iso
from retries.circuits import current_state
from retries.states import HOLD_FROM, SLOT_HOLDING_STATES, CircuitState, WaitKind


class Pool(Answer):
    name: str
    slots: int
    description: str
    used: Annotated[int, Field(description="Slots held by queued and running tasks.")]
    waiting: Annotated[int, Field(description="Ready tasks waiting for a slot.")]


class Circuit(Answer):
    name: str
    state: Annotated[str, OneOf(CircuitState)]
    opened_at: Time | None
    closed_at: Time | None
    attempts: Annotated[int, Field(description="Attempts of its tasks that ended in the window.")]
    failures: Annotated[int, Field(description="Of those, application and timeout failures.")]
    held: Annotated[int, Field(description="Ready tasks the circuit holds.")]


class PoolList(Answer):
    pools: list[Pool]


class CircuitList(Answer):
    circuits: list[Circuit]


CircuitName = Annotated[Text, Path(description="The circuit's name (a task's `circuit:`).", example="payments-api")]


class NoteBody(RequestBody):
    note: Annotated[Text, Field(description=CIRCUIT_NOTE)] = ""


router = router_answering_as_built()


def _held(kind: WaitKind, name: str) -> int:
    return TaskInstance.objects.filter(
        state__in=HOLD_FROM, waiting_for__kind=str(kind), waiting_for__name=name
    ).count()


def pool_document(pool: PoolRow) -> dict[str, Any]:
    used = TaskInstance.objects.filter(pool=pool.name, state__in=SLOT_HOLDING_STATES).aggregate(n=Sum("pool_slots"))["n"]
    return {
        "name": pool.name,
        "slots": pool.slots,
        "description": pool.description,
        "used": used or 0,
        "waiting": _held(WaitKind.POOL, pool.name),
    }


def circuit_document(circuit: CircuitRow) -> dict[str, Any]:
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
    response=PoolList,
)
def pool_list(request: HttpRequest) -> dict[str, Any]:
    return {"pools": [pool_document(pool) for pool in PoolRow.objects.order_by("name")]}


@router.get(
    "/circuits",
    summary="The circuit breakers, with their state and the attempts in their window",
    tags=["limits"],
    url_name="circuits",
    response=CircuitList,
)
def circuit_list(request: HttpRequest) -> dict[str, Any]:
    return {"circuits": [circuit_document(c) for c in CircuitRow.objects.order_by("name")]}


def _circuit_action_view(action: CircuitAction) -> Any:
    def view(request: HttpRequest, name: CircuitName, body: NoteBody = NoteBody.EMPTY) -> dict[str, Any]:
        circuit = CircuitRow.objects.filter(name=name).first()
        if circuit is None:
            raise NotFound(f"no circuit named '{name}'")
        actions.operate_circuit(circuit, action.name, request.user, note=body.note)
        return circuit_document(circuit)

    return view


add_actions(
    router,
    "/circuits/{name}",
    CIRCUIT_ACTIONS,
    _circuit_action_view,
    tags=["limits"],
    url_name="circuit",
    response=Circuit,
)
