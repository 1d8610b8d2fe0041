"""How the API's modules declare operations on their ninja routers: the answers as the views build
them, the errors only an operation gives, and the action endpoints (POST PATH/ACTION) declared
in one loop from `orchestrator.operations.action_registry`."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from ninja import Router

from orchestrator.api.access import Authenticated

ERROR = {"$ref": "#/components/schemas/Error"}


def router_answering_as_built() -> Router:
    """A router whose answers are the views' dicts as built: a key a builder leaves out (an
    attempt without a fingerprint) stays out, and a field named by its alias (`from`) keeps it."""
    return Router(by_alias=True, exclude_unset=True)


def errors(meanings: Mapping[int, str]) -> dict[str, Any]:
    """An operation's `openapi_extra`: the errors only it gives ({409: "The DAG is paused."}); the
    errors every operation of its kind gives (400, 401, 403, 404, 413) are added by app.Document."""
    content = {"application/json": {"schema": ERROR}}
    return {"responses": {status: {"description": meaning, "content": content} for status, meaning in meanings.items()}}


class Declared(Protocol):
    """What the API reads of an action's declaration in the registry."""

    @property
    def name(self) -> str: ...
    @property
    def summary(self) -> str: ...
    @property
    def permission(self) -> str: ...


Action = TypeVar("Action", bound=Declared)


def add_actions(
    on: Router, path: str, registered: Mapping[str, Action], view_for: Callable[[Action], Callable[..., Any]], **declared: Any
) -> None:
    """POST `path`/NAME for each registered action, with its summary and permission, answered by
    `view_for(action)` (named `url_name`'s prefix + name: task_clear, circuit_open) and
    otherwise declared alike (`declared`)."""
    prefix = declared.pop("url_name")
    for action in registered.values():
        view = view_for(action)
        view.__name__ = f"{prefix}_{action.name}"
        auth = Authenticated(action.permission)
        on.post(f"{path}/{action.name}", summary=action.summary, url_name=view.__name__, auth=auth, **declared)(view)
