"""Operator pages: thin views, one domain call each; htmx requests get named partials."""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from deadlines.history import dag_deadline_history
from orchestrator import actions
from orchestrator.api.queries import (
    failed_attempts,
    failure_counts,
    parse_failure_filter,
    parse_limit,
)
from orchestrator.exceptions import ActionError, BadRequest, NotFound
from orchestrator.models import AuditLog, DagRun
from orchestrator.web import presenters
from retries.states import Category, Reason

STOP_POLLING = 286  # htmx stops an `every 2s` poll on this status
RECENT_RUNS = 25
AUDIT_ROWS = 200


def is_htmx(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true"


T = TypeVar("T")


def _lookup(find: Callable[..., T], *args: str) -> T:
    """orchestrator.actions lookups, with NotFound as the 404 page."""
    try:
        return find(*args)
    except NotFound as exc:
        raise Http404(str(exc)) from exc


def run_url(run: DagRun) -> str:
    return reverse("web:run_detail", args=[run.dag.dag_id, run.run_id])


@login_required
@require_GET
def dag_list(request: HttpRequest) -> HttpResponse:
    return TemplateResponse(request, "web/dag_list.html", {"rows": presenters.dag_rows()})


def _dag_context(request: HttpRequest, dag, **extra) -> dict:
    return {
        "dag": dag,
        "tasks": presenters.task_rows(dag),
        "runs": DagRun.objects.filter(dag=dag).order_by("-queued_at", "-id")[:RECENT_RUNS],
        "may_trigger": presenters.may_trigger(request.user),
        "may_pause": request.user.has_perm("orchestrator.change_dag"),
        "dag_deadline_history": dag_deadline_history(dag),
        "default_args": presenters.pretty_json(dag.default_args),
        **extra,
    }


@login_required
@require_GET
def dag_detail(request: HttpRequest, dag_id: str) -> HttpResponse:
    dag = _lookup(actions.find_dag, dag_id)
    return TemplateResponse(request, "web/dag_detail.html", _dag_context(request, dag))


@login_required
@require_POST
def dag_trigger(request: HttpRequest, dag_id: str) -> HttpResponse:
    """Trigger a run from the form's optional JSON `conf`; then show the new run."""
    if not presenters.may_trigger(request.user):
        raise PermissionDenied("permission 'orchestrator.trigger_dagrun' required")
    dag = _lookup(actions.find_dag, dag_id)
    raw_conf = request.POST.get("conf", "").strip()
    try:
        try:
            conf = json.loads(raw_conf) if raw_conf else None
        except json.JSONDecodeError as exc:
            raise BadRequest(f"conf is not valid JSON: {exc}") from exc
        run = actions.trigger(dag, request.user, conf=conf)
    except ActionError as exc:
        context = _dag_context(request, dag, trigger_error=str(exc), conf_text=raw_conf)
        return TemplateResponse(request, "web/dag_detail.html", context, status=exc.status)
    return HttpResponseRedirect(run_url(run), status=303)


@login_required
@require_POST
def dag_pause(request: HttpRequest, dag_id: str) -> HttpResponse:
    """Pause (`paused=1`) or unpause (`paused=0`) the DAG; then show the DAG page."""
    if not request.user.has_perm("orchestrator.change_dag"):
        raise PermissionDenied("permission 'orchestrator.change_dag' required")
    dag = _lookup(actions.find_dag, dag_id)
    actions.set_paused(dag, request.user, paused=request.POST.get("paused") == "1")
    return HttpResponseRedirect(reverse("web:dag_detail", args=[dag.dag_id]), status=303)


@login_required
@require_GET
def run_detail(request: HttpRequest, dag_id: str, run_id: str) -> HttpResponse:
    """The run page; an htmx poll gets the #run-body partial, and status 286 once the run is over."""
    run = _lookup(actions.find_run, dag_id, run_id)
    context = presenters.run_context(run, request.user)
    if is_htmx(request):
        status = STOP_POLLING if context["finished"] else 200
        return TemplateResponse(request, "web/run_detail.html#run_body", context, status=status)
    return TemplateResponse(request, "web/run_detail.html", context)


@login_required
@require_POST
def task_action(request: HttpRequest, dag_id: str, run_id: str, task_id: str, action: str) -> HttpResponse:
    """clear / mark_success / mark_failed / reclassify from the run page's buttons."""
    if not request.user.has_perm(actions.ACT_PERMISSION):
        raise PermissionDenied(f"permission '{actions.ACT_PERMISSION}' required")
    ti = _lookup(actions.find_task_instance, dag_id, run_id, task_id)
    note = request.POST.get("note", "").strip()
    error, status = "", 200
    try:
        if action == "clear":
            actions.clear(ti, request.user, include_downstream=bool(request.POST.get("include_downstream")), note=note)
        else:
            actions.TASK_ACTIONS[action](ti, request.user, note=note)
    except ActionError as exc:
        error, status = str(exc), exc.status
    run = _lookup(actions.find_run, dag_id, run_id)
    if is_htmx(request):
        # htmx swaps only 2xx responses: the error is shown inside the partial.
        context = presenters.run_context(run, request.user, action_error=error)
        return TemplateResponse(request, "web/run_detail.html#run_body", context)
    if error:
        context = presenters.run_context(run, request.user, action_error=error)
        return TemplateResponse(request, "web/run_detail.html", context, status=status)
    return HttpResponseRedirect(run_url(run), status=303)


@login_required
@require_GET
def failures(request: HttpRequest) -> HttpResponse:
    """Failed attempts, filtered by category, reason, DAG and time, with counts."""
    context = {
        "categories": [c.value for c in Category],
        "reasons": [r.value for r in Reason],
        "params": request.GET,
    }
    try:
        failure_filter = parse_failure_filter(request.GET)
    except BadRequest as exc:
        context["filter_error"] = str(exc)
        return TemplateResponse(request, "web/failures.html", context, status=400)
    rows = failed_attempts(failure_filter)
    context.update(
        failure_filter=failure_filter,
        total=rows.count(),
        counts=failure_counts(rows),
        failures=[presenters.AttemptView.of(a) for a in rows[: failure_filter.limit]],
    )
    return TemplateResponse(request, "web/failures.html", context)


@login_required
@require_GET
def audit_log(request: HttpRequest) -> HttpResponse:
    """Operator actions, newest first (?dag_id=, ?username=, ?action=)."""
    entries = AuditLog.objects.all()
    filters = {name: request.GET.get(name, "").strip() for name in ("dag_id", "username", "action")}
    for name, value in filters.items():
        if value:
            entries = entries.filter(**{name: value})
    try:
        limit = parse_limit(request.GET, default=AUDIT_ROWS)
    except BadRequest:
        limit = AUDIT_ROWS
    rows = [(entry, presenters.pretty_json(entry.details)) for entry in entries.order_by("-at", "-id")[:limit]]
    return TemplateResponse(request, "web/audit_log.html", {"rows": rows, "filters": filters})
