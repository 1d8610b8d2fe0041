"""Operator pages: thin views, one domain call each; htmx requests get named partials."""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.templatetags.static import static
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from alerts import documents as alert_documents
from deadlines.history import dag_deadline_history
from orchestrator.console import audit as audit_entries
from orchestrator.console import charts, dags, deadletters, grid, mapped, taskinstance
from orchestrator.console import failures as failure_pages
from orchestrator.console import params as run_params
from orchestrator.console import run as run_page
from orchestrator.console import workers as worker_pages
from orchestrator.console.choices import Operator, bulk_choice
from orchestrator.console.text import pretty_json
from orchestrator.exceptions import ActionError, BadRequest, Conflict, NotFound
from orchestrator.models import Dag, DagRun
from orchestrator.operations import actions
from orchestrator.operations.action_registry import (
    ACT_PERMISSION,
    DAG_ACTIONS,
    DEAD_LETTER_OFFERS,
    PAUSE_PERMISSION,
    TASK_ACTIONS,
    TRIGGER_PERMISSION,
)
from orchestrator.web import approvals, backfill_pages
from orchestrator.web.pages import STOP_POLLING, is_htmx, lookup, polled, require
from retries.states import Category, Reason

RECENT_RUNS = 25
TASK_INCIDENTS = 20  # the alert incidents a task page lists, latest first
AUDIT_ROWS = 200


def run_url(run: DagRun) -> str:
    return reverse("web:run_detail", args=[run.dag.dag_id, run.run_id])


def operator(request: HttpRequest) -> Operator:
    """What the requesting user may do, as orchestrator.operations.actions decides it, for the console."""
    return Operator(
        may_act=actions.may_act(request.user),
        allowed=partial(actions.allowed_actions, user=request.user),
        downstream=actions.downstream_of,
        allowed_by_state=partial(actions.allowed_by_state, user=request.user),
    )


@login_required
@require_GET
def dag_list(request: HttpRequest) -> HttpResponse:
    """Every DAG, or `?owner=TEAM`'s, with their last runs."""
    owner = request.GET.get("owner", "").strip()
    return TemplateResponse(request, "web/dag_list.html", {"rows": dags.dag_rows(owner=owner), "owner": owner, "owners": dags.owners()})


def _page_number(request: HttpRequest, name: str = "page") -> int:
    """?page=N, or the DAG page's ?grid_page=N and ?tasks_page=N, or the task page's ?state_page=N (1 when absent or not a positive
    number: a bad link still shows the page)."""
    raw = request.GET.get(name, "1")
    return int(raw) if raw.isdigit() and len(raw) < 9 else 1


def _dag_context(request: HttpRequest, dag: Dag, **extra: Any) -> dict[str, Any]:
    dag_grid = grid.build(dag, limit=RECENT_RUNS, page=_page_number(request, "grid_page"))
    tasks = dags.task_page(dag, _page_number(request, "tasks_page"))
    return {
        "dag": dag,
        "tasks": tasks,
        "grid": dag_grid,
        "runs": dag_grid.runs[::-1],
        "deadline_chart": charts.deadline_history([r.run for r in dag_grid.runs]),
        "may_trigger": actions.may_trigger(request.user),
        "may_pause": actions.may_pause(request.user),
        "trigger": DAG_ACTIONS["trigger"],
        "toggle": DAG_ACTIONS["unpause" if dag.paused else "pause"],
        "dag_deadline_history": dag_deadline_history(dag),
        "default_args": pretty_json(dag.default_args),
        "backfills": backfill_pages.recent_backfills(dag),
        "budget": tasks.verdicts,
        "form": {},
        "param_fields": run_params.param_fields(dag.params),
        **extra,
    }


@login_required
@require_GET
def dag_detail(request: HttpRequest, dag_id: str) -> HttpResponse:
    """The DAG page; an htmx poll gets the #dag-grid partial, and status 286 once no run is active."""
    dag = lookup(actions.find_dag, dag_id)
    if is_htmx(request):
        dag_grid = grid.build(dag, limit=RECENT_RUNS, page=_page_number(request, "grid_page"))
        status = 200 if dag_grid.active else STOP_POLLING
        return TemplateResponse(request, "web/dag_detail.html#dag_grid", {"dag": dag, "grid": dag_grid}, status=status)
    return TemplateResponse(request, "web/dag_detail.html", _dag_context(request, dag))


@login_required
@require_POST
def dag_trigger(request: HttpRequest, dag_id: str) -> HttpResponse:
    """Trigger a run from the form's fields (one per param) over its optional JSON `conf`, at its
    optional logical date; then show the new run. A refusal comes back on the form, beside the
    param or the logical date it names."""
    require(actions.may_trigger(request.user), TRIGGER_PERMISSION)
    dag = lookup(actions.find_dag, dag_id)
    raw_conf = request.POST.get("conf", "").strip()
    posted = run_params.posted_values(dag.params, request.POST)
    logical_date = request.POST.get("logical_date", "").strip()
    try:
        conf = run_params.conf_from_form(dag.params, raw_conf, posted)
        run = actions.trigger(dag, request.user, conf=conf, logical_date=logical_date or None)
    except ActionError as exc:
        bad_date = exc.field == "logical_date"
        beside = bad_date or run_params.is_beside_a_field(dag.params, exc)
        context = _dag_context(
            request, dag, trigger_error="" if beside else str(exc), conf_text=raw_conf,
            param_fields=run_params.param_fields(dag.params, posted, exc),
            logical_date_text=logical_date, logical_date_error=str(exc) if bad_date else "",
        )  # fmt: skip
        return TemplateResponse(request, "web/dag_detail.html", context, status=exc.status)
    if (note := actions.waits_for_unpause(dag)) is not None:
        messages.warning(request, note)
    return HttpResponseRedirect(run_url(run), status=303)


@login_required
@require_POST
def dag_pause(request: HttpRequest, dag_id: str) -> HttpResponse:
    """Pause (`paused=1`) or unpause (`paused=0`) the DAG; then show the DAG page."""
    require(actions.may_pause(request.user), PAUSE_PERMISSION)
    dag = lookup(actions.find_dag, dag_id)
    actions.set_paused(dag, request.user, paused=request.POST.get("paused") == "1")
    return HttpResponseRedirect(reverse("web:dag_detail", args=[dag.dag_id]), status=303)


@login_required
@require_GET
def run_detail(request: HttpRequest, dag_id: str, run_id: str) -> HttpResponse:
    """The run page; an htmx poll gets the #run-body partial, and status 286 once the run is over."""
    run = lookup(actions.find_run, dag_id, run_id)
    context = run_page.context(run, operator(request), page=_page_number(request))
    return polled(request, "web/run_detail.html", "run_body", context, finished=context["finished"])


@login_required
@require_POST
def task_action(request: HttpRequest, dag_id: str, run_id: str, task_id: str, action: str) -> HttpResponse:
    """clear / mark_success / mark_failed / reclassify from the run page's buttons."""
    _require_act(request)
    map_index = _map_index(request.POST.get("map_index"))
    instances = lookup(actions.find_task_instances, dag_id, run_id, task_id, map_index)
    # A mapped task's page acts on every instance, or on the failed ones ("scope"), once confirmed.
    instances = mapped.selected(instances, request.POST.get("scope", "all")) if map_index is None else instances
    note = request.POST.get("note", "").strip()
    options = {option.name: bool(request.POST.get(option.name)) for option in TASK_ACTIONS[action].options}
    error, status = "", 200
    try:
        if not instances:
            raise Conflict("no instance of the task is in the state this action was asked for")
        actions.act_on_task(action, instances, request.user, note=note, **options)
    except ActionError as exc:
        error, status = str(exc), exc.status
    label = task_id if map_index is None else f"{task_id}[{map_index}]"
    notice = "" if error else TASK_ACTIONS[action].confirmation(label, note)
    if request.POST.get("back") == "task":
        url = taskinstance.task_url(dag_id, run_id, task_id) + ("" if map_index is None else f"?map_index={map_index}")
        task_page = partial(_task_page, request, dag_id, run_id, task_id, map_index)
        return _after_action(request, "web/task_detail.html", "task_body", task_page, url, error, status, notice)
    run = lookup(actions.find_run, dag_id, run_id)
    run_context = partial(run_page.context, run, operator(request))
    return _after_action(request, "web/run_detail.html", "run_body", run_context, run_url(run), error, status, notice)


def _after_action(
    request: HttpRequest, template: str, body: str, page: Callable[..., dict[str, Any]], url: str, error: str, status: int, notice: str
) -> HttpResponse:
    """The page an action came from: for htmx its `body` partial with the error or what was done
    (htmx swaps only 2xx responses); else the page with the error, or a redirect to it."""
    if is_htmx(request):
        return TemplateResponse(request, f"{template}#{body}", page(action_error=error, notice=notice))
    if error:
        return TemplateResponse(request, template, page(action_error=error), status=status)
    messages.success(request, notice)
    return HttpResponseRedirect(url, status=303)


def _map_index(raw: str | None) -> int | None:
    """A map_index from a form or query string; a bad one is a 404 (no such instance)."""
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise Http404(f"map_index must be a whole number, not {raw[:40]!r}") from None


def _task_page(
    request: HttpRequest, dag_id: str, run_id: str, task_id: str, map_index: int | None, *, action_error: str = "", notice: str = ""
) -> dict:
    """One task instance's page, or a mapped task's page: its instances and what acts on all."""
    try:
        # A task that is not mapped (or not expanded yet) has one instance, map_index -1.
        instances = actions.find_task_instances(dag_id, run_id, task_id, -1 if map_index is None else map_index)
    except NotFound as exc:
        if map_index is not None:
            raise Http404(str(exc)) from exc
        run = lookup(actions.find_run, dag_id, run_id)
        page = taskinstance.mapped_context(
            run, task_id, operator(request), request.GET.get("state", ""), _page_number(request), action_error=action_error, notice=notice
        )
        if page is None:
            raise Http404(f"run '{run_id}' of DAG '{dag_id}' has no task '{task_id}'") from exc
        return page
    return taskinstance.context(
        instances[0], operator(request), action_error=action_error, notice=notice, state_page=_page_number(request, "state_page")
    )


@login_required
@require_GET
def task_detail(request: HttpRequest, dag_id: str, run_id: str, task_id: str) -> HttpResponse:
    """One task instance: attempts to scale, contexts, output, and the actions it allows (a
    mapped task: its instances, `?map_index=N` for one, `?state=` to filter)."""
    context = _task_page(request, dag_id, run_id, task_id, _map_index(request.GET.get("map_index")))
    if context.get("ti") is not None:
        context["incidents"] = list(alert_documents.incidents(task_instance_id=context["ti"].pk)[:TASK_INCIDENTS])
    context["approval"] = approvals.approval_context(request.user, context.get("ti"))
    return polled(request, "web/task_detail.html", "task_body", context, finished=context["finished"])


@login_required
@require_GET
def task_output(request: HttpRequest, dag_id: str, run_id: str, task_id: str, token: int, stream: str) -> HttpResponse:
    """The whole stored stdout or stderr of one attempt, as plain text (never rendered as HTML)."""
    ti = lookup(actions.find_task_instance, dag_id, run_id, task_id, _map_index(request.GET.get("map_index")))
    text = taskinstance.output_text(ti, token, stream)
    if text is None:
        raise Http404("no such attempt output")
    response = HttpResponse(text, content_type="text/plain; charset=utf-8")
    response["X-Content-Type-Options"] = "nosniff"
    return response


@login_required
@require_GET
def task_output_file(request: HttpRequest, dag_id: str, run_id: str, task_id: str, token: int, stream: str) -> FileResponse:
    """One attempt's stream as the output store keeps it (up to its cap), streamed from the file
    as plain text: never rendered as HTML, whatever bytes the task wrote."""
    ti = lookup(actions.find_task_instance, dag_id, run_id, task_id, _map_index(request.GET.get("map_index")))
    reader = taskinstance.output_file(ti, token, stream)
    if reader is None:
        raise Http404("the output store does not have this output")
    response = FileResponse(reader, content_type="text/plain; charset=utf-8", filename=f"{ti.pk}-{token}.{stream}.txt")
    response["X-Content-Type-Options"] = "nosniff"
    return response


@login_required
@require_GET
def fingerprint(request: HttpRequest, fingerprint: str) -> HttpResponse:
    """Every task instance that failed the same way (same fingerprint)."""
    rows, found = taskinstance.same_failure(fingerprint)
    context = {"fingerprint": fingerprint, "rows": rows, "more": found > len(rows)}
    return TemplateResponse(request, "web/fingerprint.html", context)


def _require_act(request: HttpRequest) -> None:
    require(actions.may_act(request.user), ACT_PERMISSION)


def _bulk_message(request: HttpRequest, verb: str, done: list[str], errors: list[str]) -> None:
    messages.info(request, f"{verb}: {len(done)} task instance{'s' if len(done) != 1 else ''}.")
    for error in errors:
        messages.error(request, error)


@login_required
@require_POST
def run_clear_failed(request: HttpRequest, dag_id: str, run_id: str) -> HttpResponse:
    """Clear every failed task of the run (their upstream_failed downstream tasks follow)."""
    _require_act(request)
    run = lookup(actions.find_run, dag_id, run_id)
    note = request.POST.get("note", "").strip()
    done, errors = actions.act_on_many("clear", actions.failed_in_run(run), request.user, note=note)
    _bulk_message(request, TASK_ACTIONS["clear"].past, done, errors)
    return HttpResponseRedirect(run_url(run), status=303)


@login_required
@require_GET
def dead_letters(request: HttpRequest) -> HttpResponse:
    url = reverse("web:dead_letter_action")
    groups = [(group, [bulk_choice(offer, url, n=group.count) for offer in DEAD_LETTER_OFFERS]) for group in deadletters.groups()]
    return TemplateResponse(request, "web/dead_letters.html", {"groups": groups, "may_act": actions.may_act(request.user)})


BULK_DEAD_LETTER_ACTIONS = tuple(offer.action for offer in DEAD_LETTER_OFFERS)


@login_required
@require_POST
def dead_letter_action(request: HttpRequest) -> HttpResponse:
    """Clear or mark failed every dead-lettered task instance of one fingerprint group."""
    _require_act(request)
    action = request.POST.get("action", "")
    if action not in BULK_DEAD_LETTER_ACTIONS:
        return HttpResponse(f"action must be {' or '.join(BULK_DEAD_LETTER_ACTIONS)}", status=400, content_type="text/plain")
    group = deadletters.in_group(request.POST.get("fingerprint", "").strip())
    note = request.POST.get("note", "").strip()
    done, errors = actions.act_on_many(action, group, request.user, note=note)
    _bulk_message(request, TASK_ACTIONS[action].past, done, errors)
    return HttpResponseRedirect(reverse("web:dead_letters"), status=303)


@login_required
@require_GET
def failures(request: HttpRequest) -> HttpResponse:
    """Failed attempts over a window, counted by category, reason, DAG, task, host and fingerprint."""
    context: dict[str, Any] = {
        "windows": list(failure_pages.WINDOWS),
        "categories": [c.value for c in Category],
        "reasons": [r.value for r in Reason],
        "params": request.GET,
    }
    try:
        flt = failure_pages.parse(request.GET)
    except BadRequest as exc:
        context["filter_error"] = str(exc)
        return TemplateResponse(request, "web/failures.html", context, status=400)
    context.update(failure_pages.page(flt), flt=flt)
    return TemplateResponse(request, "web/failures.html", context)


@login_required
@require_GET
def workers(request: HttpRequest) -> HttpResponse:
    """Live workers with what they run, and queues with their depth; unattended queues flagged."""
    rows = worker_pages.workers()
    context = {"workers": rows, "queues": worker_pages.queues(rows), "set_aside": worker_pages.set_aside()}
    return TemplateResponse(request, "web/workers.html", context)


def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico whatever the page says: send them to the static icon."""
    return HttpResponseRedirect(static("favicon.svg"), status=301)


@login_required
@require_GET
def audit_log(request: HttpRequest) -> HttpResponse:
    """Operator actions, newest first, filtered as `GET /api/v1/audit` is (`console/audit.py`);
    a bad filter is shown above the table (400)."""
    params = request.GET.copy()
    legacy = request.GET.get("username", "")
    if legacy and not params.get("user"):  # the page's older links
        params["user"] = legacy
    if not params.get("limit", "").strip():
        params["limit"] = str(AUDIT_ROWS)
    context: dict[str, Any] = {"filters": params}
    try:
        flt = audit_entries.parse(params)
    except BadRequest as exc:
        context["filter_error"] = str(exc)
        return TemplateResponse(request, "web/audit_log.html", context, status=400)
    found = audit_entries.page(flt)
    rows = [(entry, pretty_json(entry.details), audit_entries.map_index(entry)) for entry in found.rows]
    context.update(rows=rows, count=found.count)
    return TemplateResponse(request, "web/audit_log.html", context)
