"""Approvals in the console: the list of tasks waiting for one (oldest first), and the task
page's Approve / Reject (with a note, confirmed) for those allowed to decide (engine/waits.py)."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.views.decorators.http import require_GET, require_POST

from orchestrator.console.taskinstance import task_url
from orchestrator.engine import waits
from orchestrator.exceptions import ActionError, Forbidden
from orchestrator.models import TaskInstance
from orchestrator.operations import actions
from orchestrator.operations.action_registry import APPROVAL_ACTIONS
from orchestrator.web.pages import lookup


def approval_context(user: Any, ti: TaskInstance | None) -> dict[str, Any] | None:
    """What the task page shows of an approval the task waits for: its message, who may decide,
    and whether this user may (then the page offers Approve and Reject)."""
    if ti is None or not waits.waits_for_approval(ti):
        return None
    groups = waits.approvers_of(ti)
    query = f"?map_index={ti.map_index}" if ti.map_index >= 0 else ""
    base = task_url(ti.dag_run.dag.dag_id, ti.dag_run.run_id, ti.task_id).rstrip("/")
    return {
        "message": waits.approval_message(ti),
        "who": f"members of {', '.join(groups)}" if groups else "anyone with the approve permission",
        "may_decide": waits.refusal(user, ti) is None,
        "choices": [{"action": action, "url": f"{base}/{action.name}{query}"} for action in APPROVAL_ACTIONS.values()],
        "map_index": ti.map_index,
    }


def _parsed(since: Any) -> datetime | None:
    """`waiting_for`'s ISO `since` as a datetime, for the page's usual rendering of a time."""
    try:
        return datetime.fromisoformat(since) if isinstance(since, str) else None
    except ValueError:
        return None


@login_required
@require_GET
def approvals(request: HttpRequest) -> HttpResponse:
    """Every task waiting for an approval, the longest waiting first."""
    rows = [
        {
            "ti": ti,
            "url": task_url(ti.dag_run.dag.dag_id, ti.dag_run.run_id, ti.task_id) + (f"?map_index={ti.map_index}" if ti.map_index >= 0 else ""),
            "message": waits.approval_message(ti),
            "since": _parsed((ti.waiting_for or {}).get("since")),
            "approvers": waits.approvers_of(ti),
            "may_decide": waits.refusal(request.user, ti) is None,
        }
        for ti in waits.waiting_for_approval()
    ]
    return TemplateResponse(request, "web/approvals.html", {"rows": rows})


@login_required
@require_POST
def decide(request: HttpRequest, dag_id: str, run_id: str, task_id: str, action: str) -> HttpResponse:
    """Approve or reject from the task page; back to it with what happened."""
    raw = request.GET.get("map_index") or request.POST.get("map_index")
    map_index = int(raw) if raw and raw.lstrip("-").isdigit() and int(raw) >= 0 else None
    instances = lookup(actions.find_task_instances, dag_id, run_id, task_id, map_index)
    note = request.POST.get("note", "").strip()
    decision = APPROVAL_ACTIONS[action]
    try:
        waits.decide(instances, request.user, approve=decision.approves, note=note)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from exc  # 403, as every action the user may not take
    except ActionError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, decision.confirmation(task_id, note))
    url = task_url(dag_id, run_id, task_id) + (f"?map_index={map_index}" if map_index is not None else "")
    return HttpResponseRedirect(url)
