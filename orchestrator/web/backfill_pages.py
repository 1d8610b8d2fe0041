"""Backfill pages: the form's preview (nothing created yet), creating it, its progress page and
its pause, unpause and cancel buttons. Thin views around orchestrator.operations.backfills."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from orchestrator.exceptions import ActionError, BadRequest
from orchestrator.foundation.run_params import ParamError, conf_from_text
from orchestrator.models import TRIGGER_PERMISSION, Backfill, BackfillDate
from orchestrator.operations import actions, backfills
from orchestrator.operations.action_registry import BackfillAction
from orchestrator.web.pages import lookup, polled, require

FORM_FIELDS = ("from", "to", "reprocess", "max_active_runs", "backwards", "conf")


def _require_trigger(request: HttpRequest) -> None:
    require(actions.may_trigger(request.user), TRIGGER_PERMISSION)


def _checked(dag: Any, form: dict[str, str]) -> backfills.Request:
    """The form's fields as backfill arguments (checked by orchestrator.operations.backfills)."""
    try:
        conf = conf_from_text(form["conf"])
    except BadRequest as exc:
        raise backfills.BackfillError("conf", str(exc).removeprefix("conf ")) from None
    text = form["max_active_runs"].strip() or str(backfills.DEFAULT_MAX_ACTIVE_RUNS)
    if not text.isdigit():
        raise backfills.BackfillError("max_active_runs", f"must be a whole number, not {text!r}")
    return backfills.check(
        dag, start=form["from"], end=form["to"], reprocess=form["reprocess"] or "none",
        max_active_runs=int(text), backwards=form["backwards"] == "1", conf=conf,
    )  # fmt: skip


@login_required
@require_POST
def backfill_new(request: HttpRequest, dag_id: str) -> HttpResponse:
    """`step=preview`: the dry run's dates, with a button to create it; `step=create`: create
    it and show its page. Errors come back on the form, naming the field."""
    _require_trigger(request)
    dag = lookup(actions.find_dag, dag_id)
    form = {name: request.POST.get(name, "") for name in FORM_FIELDS}
    for permission in backfills.permissions_for(form["reprocess"] or Backfill.Reprocess.NONE):
        require(request.user.has_perm(permission), permission)
    try:
        checked = _checked(dag, form)
        if request.POST.get("step") == "create":
            backfill = backfills.create(checked, request.user)
            return HttpResponseRedirect(reverse("web:backfill_detail", args=[backfill.pk]), status=303)
        planned = backfills.preview(checked)
    except ActionError as exc:
        field = "conf" if isinstance(exc, ParamError) else getattr(exc, "argument", "")
        context = {"dag": dag, "form": form, "error": str(exc), "field": field, "may_trigger": True}
        return TemplateResponse(request, "web/backfill_new.html", context, status=exc.status)
    counts = {action: sum(1 for p in planned if p.action == action) for action in BackfillDate.Action.values}
    return TemplateResponse(request, "web/backfill_new.html", {"dag": dag, "form": form, "planned": planned, "counts": counts, "may_trigger": True})


def _page_context(request: HttpRequest, backfill: Backfill) -> dict[str, Any]:
    doc = backfills.document(backfill)
    runs = doc["runs"]
    total = max(1, runs["total"])
    segments = [
        (state, runs[state], round(100 * runs[state] / total, 2))
        for state in ("success", "failed", "running", "queued", "pending")
        if runs[state]
    ]
    if doc["cancelled"]:
        segments.append(("cancelled", doc["cancelled"], round(100 * doc["cancelled"] / total, 2)))
    dates = backfill.dates.select_related("dag_run").order_by("-logical_date" if backfill.backwards else "logical_date")
    return {
        "backfill": backfill,
        "doc": doc,
        "dag": backfill.dag,
        "segments": segments,
        "done": runs["success"] + runs["failed"],
        "dates": dates,
        "over": backfills.is_over(backfill),
        "choices": [_choice(backfill, action, pending=runs["pending"]) for action in backfills.moves_from(backfill)],
        "may_act": actions.may_trigger(request.user),
    }


@dataclass(frozen=True)
class BackfillChoice:
    """A button of the backfill page, as the registry declares its action."""

    name: str
    label: str
    url: str
    explanation: str  # empty: taken without asking to confirm
    danger: bool


def _choice(backfill: Backfill, action: BackfillAction, *, pending: int) -> BackfillChoice:
    url = reverse(f"web:backfill_{action.name}", args=[backfill.pk])
    return BackfillChoice(action.name, action.label, url, action.explain(pending) if action.explain else "", action.danger)


@login_required
@require_GET
def backfill_detail(request: HttpRequest, backfill_id: str) -> HttpResponse:
    """The backfill page; an htmx poll gets the #backfill-body partial (286 once it is over)."""
    context = _page_context(request, lookup(backfills.find, backfill_id))
    return polled(request, "web/backfill_detail.html", "backfill_body", context, finished=context["over"])


@login_required
@require_POST
def backfill_action(request: HttpRequest, backfill_id: str, action: str) -> HttpResponse:
    _require_trigger(request)
    backfill = lookup(backfills.find, backfill_id)
    try:
        backfills.act(backfill, action, request.user)
    except ActionError as exc:
        context = {**_page_context(request, backfill), "error": str(exc)}
        return TemplateResponse(request, "web/backfill_detail.html", context, status=exc.status)
    return HttpResponseRedirect(reverse("web:backfill_detail", args=[backfill.pk]), status=303)


def recent_backfills(dag: Any, limit: int = 5) -> list[dict[str, Any]]:
    """The DAG page's list: its newest backfills with their progress."""
    return [{**backfills.document(b), "object": b} for b in Backfill.objects.select_related("dag").filter(dag=dag)[:limit]]

