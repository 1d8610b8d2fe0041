"""The Django admin: DAGs and tasks are edited here under the same rules as `import_dags`;
runs, task instances, attempts and the audit log can be browsed but not changed."""
from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from deadlines.models import DeadlineDefinition
from orchestrator.exceptions import ActionError
from orchestrator.models import (
    ApiToken,
    AuditLog,
    Circuit,
    Dag,
    DagRun,
    Pool,
    Task,
    TaskAttempt,
    TaskInstance,
)
from orchestrator.operations import actions
from orchestrator.operations.action_registry import DAG_ACTIONS
from orchestrator.specs.budget import dag_verdicts
from orchestrator.specs.forms import (
    DagForm,
    DeadlineForm,
    DeadlineInlineFormSet,
    KeptFormsMixin,
    StandaloneTaskForm,
    TaskDeadlineForm,
    TaskDeadlineInlineFormSet,
    TaskForm,
    TaskInlineFormSet,
)
from orchestrator.specs.importer import DEADLINE_FIELDS as SPEC_DEADLINE_FIELDS
from orchestrator.specs.importer import SCHEDULE_FIELDS, forget_spec_hash, refresh_fixed_datetimes
from orchestrator.specs.wait_schema import dag_run_warnings
from retries.budget import seconds

# A deadline's datetime is edited as written (datetime_text); the aware value derives from it.
DEADLINE_FIELDS = tuple(field for field in SPEC_DEADLINE_FIELDS if field != "datetime")


def save_in_order(formset: BaseInlineFormSet, **extra: Any) -> None:
    """Save an inline formset with `position` = row order; `extra` attributes are set on every row."""
    if not isinstance(formset, KeptFormsMixin):
        raise TypeError(f"{type(formset).__name__} does not say which of its forms it keeps")
    formset.save(commit=False)  # fills deleted_objects; nothing written yet
    for obj in formset.deleted_objects:
        obj.delete()  # first, so a new row may reuse a deleted row's task_id
    for position, form in enumerate(formset.kept_forms()):
        obj = form.instance
        stale = {name: value for name, value in extra.items() if getattr(obj, name) != value}
        for name, value in stale.items():
            setattr(obj, name, value)
        if obj.pk is None or form.has_changed() or obj.position != position or stale:
            obj.position = position
            obj.save()


def warn_of_unknown_awaited_dags(model_admin: admin.ModelAdmin, request: HttpRequest, dag: Dag) -> None:
    """A `dag_run` wait on a DAG not defined (yet) is saved, with the warning an import prints."""
    waits = [{"task_id": task.task_id, "wait_for": task.wait_for} for task in dag.tasks.filter(wait_for__isnull=False)]
    if not waits:
        return
    known = set(Dag.objects.values_list("dag_id", flat=True))
    for text in dag_run_warnings({"tasks": waits}, known):
        model_admin.message_user(request, f"warning: {text}", messages.WARNING)


# --- DAGs and tasks -----------------------------------------------------------------------


class TaskInline(admin.TabularInline):
    model = Task
    form = TaskForm
    formset = TaskInlineFormSet
    fields = (
        "task_id",
        "python_callable",
        "bash_command",
        "wait_for",
        "op_kwargs",
        "upstream",
        "trigger_rule",
        "retries",
        "execution_timeout",
        "queue",
        "args",
    )
    extra = 1
    show_change_link = True


class DagDeadlineInline(admin.StackedInline):
    model = DeadlineDefinition
    form = DeadlineForm
    formset = DeadlineInlineFormSet
    fields = DEADLINE_FIELDS
    extra = 0
    verbose_name = "DAG deadline"
    verbose_name_plural = "DAG deadlines"

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # Task-level definitions share the DAG foreign key; they are edited on their task's page.
        return super().get_queryset(request).filter(task__isnull=True)


@admin.register(Dag)
class DagAdmin(admin.ModelAdmin):
    form = DagForm
    inlines = [TaskInline, DagDeadlineInline]
    list_display = ("dag_id", "owner", "schedule", "timezone", "paused", "task_count", "next_run_logical_date", "updated_at")
    list_filter = ("paused", "catchup", "timezone", "owner")
    search_fields = ("dag_id", "description", "owner")
    readonly_fields = ("next_run_logical_date", "created_at", "updated_at", "retry_budgets")
    fieldsets = (
        (None, {"fields": ("dag_id", "description", "owner", "paused")}),
        ("Schedule", {"fields": ("schedule", "timezone", "start_date", "catchup", "max_active_runs")}),
        ("Run parameters", {"fields": ("params", "strict_params")}),
        ("Task defaults", {"fields": ("default_args",)}),
        ("Retry budgets against deadlines", {"fields": ("retry_budgets",)}),
        ("Bookkeeping", {"fields": ("next_run_logical_date", "created_at", "updated_at"), "classes": ("collapse",)}),
    )
    actions = ["trigger_run", "pause", "unpause"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).annotate(task_total=Count("tasks"))

    def render_change_form(self, request: HttpRequest, context: dict, *args, **kwargs):
        # The task inline needs the whole width to show whole ids and callables: no side menu here.
        context["is_nav_sidebar_enabled"] = False
        return super().render_change_form(request, context, *args, **kwargs)

    @admin.display(description="verdicts")
    def retry_budgets(self, dag: Dag) -> str:
        """Each task's worst case against each deadline that bounds it (as saved), with the
        platform budget's worst case beside it."""
        if dag.pk is None:
            return "Saved DAGs only."
        verdicts = dag_verdicts(dag)
        if not verdicts:
            return "No task with an execution_timeout has a deadline that bounds it."
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{} s</td><td>{} s</td><td>+{} s</td><td>{}</td></tr>",
            (
                (v.task_id, v.deadline, seconds(v.worst_case), seconds(v.interval), seconds(v.platform_worst_case), "fits" if v.fits else "CAN MISS")
                for v in verdicts
            ),
        )
        return format_html(
            "<table><thead><tr><th>task</th><th>deadline</th><th>worst case</th><th>interval</th>"
            "<th>platform worst case</th><th>verdict</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    @admin.display(description="tasks", ordering="task_total")
    def task_count(self, dag: Dag) -> int:
        return int(getattr(dag, "task_total", 0))  # annotated by get_queryset

    def save_model(self, request: HttpRequest, obj: Dag, form: DagForm, change: bool) -> None:
        if change and SCHEDULE_FIELDS & set(form.changed_data):
            obj.next_run_logical_date = None  # the scheduler recomputes it
        super().save_model(request, obj, form, change)
        actions.record_edit(request.user, obj.dag_id, "admin_change_dag" if change else "admin_add_dag", {"fields": list(form.changed_data)})

    def save_formset(self, request: HttpRequest, form: DagForm, formset: BaseInlineFormSet, change: bool) -> None:
        if formset.model is DeadlineDefinition:
            save_in_order(formset, task_id=None)
        else:
            save_in_order(formset)
            _audit_task_rows(request, form.instance.dag_id, formset)

    def save_related(self, request: HttpRequest, form: DagForm, formsets: list, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        refresh_fixed_datetimes(form.instance)
        forget_spec_hash(form.instance.pk)
        warn_of_unknown_awaited_dags(self, request, form.instance)

    @admin.action(description=DAG_ACTIONS["trigger"].admin_description, permissions=["trigger"])
    def trigger_run(self, request: HttpRequest, queryset: QuerySet) -> None:
        for dag in queryset:
            try:
                run = actions.trigger(dag, request.user, conf={})
            except ActionError as exc:
                self.message_user(request, str(exc), messages.ERROR)
                continue
            self.message_user(request, f"Triggered {dag.dag_id}: {run.run_id}", messages.SUCCESS)
            if (note := actions.waits_for_unpause(dag)) is not None:
                self.message_user(request, note, messages.WARNING)

    def has_trigger_permission(self, request: HttpRequest) -> bool:
        return actions.may_trigger(request.user)

    @admin.action(description=DAG_ACTIONS["pause"].admin_description, permissions=["change"])
    def pause(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._set_paused(request, queryset, paused=True)

    @admin.action(description=DAG_ACTIONS["unpause"].admin_description, permissions=["change"])
    def unpause(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._set_paused(request, queryset, paused=False)

    def _set_paused(self, request: HttpRequest, queryset: QuerySet, *, paused: bool) -> None:
        verb = "pause" if paused else "unpause"
        changed = sum(1 for dag in queryset if actions.set_paused(dag, request.user, paused=paused))
        self.message_user(request, f"{verb.capitalize()}d {changed} DAG{'s' if changed != 1 else ''}.")


class TaskDeadlineInline(admin.StackedInline):
    model = DeadlineDefinition
    fk_name = "task"
    form = TaskDeadlineForm
    formset = TaskDeadlineInlineFormSet
    fields = DEADLINE_FIELDS
    extra = 0
    verbose_name = "task deadline"
    verbose_name_plural = "task deadlines"


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    form = StandaloneTaskForm
    inlines = [TaskDeadlineInline]
    list_display = ("task_id", "dag", "kind", "trigger_rule", "position")
    list_filter = ("trigger_rule", "dag")
    search_fields = ("task_id", "dag__dag_id", "python_callable", "bash_command")
    list_select_related = ("dag",)
    fields = ("dag", *TaskInline.fields, "expand", "position")

    @admin.display(description="kind")
    def kind(self, task: Task) -> str:
        if task.wait_for:
            return "wait"
        return "python" if task.python_callable else "bash"

    def get_readonly_fields(self, request: HttpRequest, obj: Task | None = None) -> tuple[str, ...]:
        # Moving a task to another DAG would break the upstreams of both.
        return ("dag",) if obj is not None else ()

    def save_formset(
        self, request: HttpRequest, form: StandaloneTaskForm, formset: BaseInlineFormSet, change: bool
    ) -> None:
        save_in_order(formset, dag_id=form.instance.dag_id)
        forget_spec_hash(form.instance.dag_id)

    def save_model(self, request: HttpRequest, obj: Task, form: StandaloneTaskForm, change: bool) -> None:
        super().save_model(request, obj, form, change)
        forget_spec_hash(obj.dag_id)
        details = {"task_id": obj.task_id, "fields": list(form.changed_data)}
        actions.record_edit(request.user, obj.dag.dag_id, "admin_change_task" if change else "admin_add_task", details)
        warn_of_unknown_awaited_dags(self, request, obj.dag)

    def delete_model(self, request: HttpRequest, obj: Task) -> None:
        super().delete_model(request, obj)
        forget_spec_hash(obj.dag_id)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        dag_pks = set(queryset.values_list("dag_id", flat=True))
        super().delete_queryset(request, queryset)
        for dag_pk in dag_pks:
            forget_spec_hash(dag_pk)


def _audit_task_rows(request: HttpRequest, dag_id: str, formset: BaseInlineFormSet) -> None:
    """One audit entry for the task rows a DAG's admin page added, changed or deleted."""
    # save_in_order's formset.save(commit=False) filled these lists.
    added = [obj.task_id for obj in formset.new_objects]
    changed = [obj.task_id for obj, _fields in formset.changed_objects]
    deleted = [obj.task_id for obj in formset.deleted_objects]
    if added or changed or deleted:
        actions.record_edit(request.user, dag_id, "admin_change_tasks", {"added": added, "changed": changed, "deleted": deleted})


# --- browsing only -------------------------------------------------------------------------


class ReadOnlyMixin:
    """Runs and their history change through the scheduler, workers and API, never by hand."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class TaskInstanceInline(ReadOnlyMixin, admin.TabularInline):
    model = TaskInstance
    fields = ("task_id", "state", "try_number", "max_tries", "infrastructure_try_number", "next_retry_at", "end_date")
    readonly_fields = fields
    show_change_link = True
    extra = 0


@admin.register(DagRun)
class DagRunAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("run_id", "dag", "run_type", "state", "logical_date", "queued_at", "start_date", "end_date")
    list_filter = ("state", "run_type")
    search_fields = ("run_id", "dag__dag_id", "triggered_by")
    list_select_related = ("dag",)
    date_hierarchy = "queued_at"
    inlines = [TaskInstanceInline]


# An attempt's columns, in the task instance's inline and in the attempts' list alike.
ATTEMPT_COLUMNS = ("attempt_token", "try_number", "infrastructure_try_number", "kind", "state", "start_date", "end_date")


class TaskAttemptInline(ReadOnlyMixin, admin.TabularInline):
    model = TaskAttempt
    fields = (*ATTEMPT_COLUMNS, "context", "fingerprint")
    readonly_fields = fields
    show_change_link = True
    extra = 0


@admin.register(TaskInstance)
class TaskInstanceAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "task_id",
        "dag_run",
        "state",
        "try_number",
        "max_tries",
        "infrastructure_try_number",
        "failure_fingerprint",
        "updated_at",
    )
    list_filter = ("state", "queue")
    search_fields = ("task_id", "dag_run__run_id", "dag_run__dag__dag_id", "failure_fingerprint")
    list_select_related = ("dag_run__dag",)
    inlines = [TaskAttemptInline]


@admin.register(TaskAttempt)
class TaskAttemptAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("task_instance", *ATTEMPT_COLUMNS, "fingerprint")
    list_filter = ("kind", "state")
    search_fields = ("task_instance__task_id", "task_instance__dag_run__run_id", "fingerprint")
    list_select_related = ("task_instance",)


@admin.register(AuditLog)
class AuditLogAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("at", "username", "action", "dag_id", "run_id", "task_id", "prior_state", "new_state")
    list_filter = ("action",)
    search_fields = ("username", "dag_id", "run_id", "task_id")
    date_hierarchy = "at"


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are created with `manage.py create_api_token` (only then is the token shown); revoke here."""

    list_display = ("user", "created_at", "last_used_at")
    fields = ("user", "created_at", "last_used_at")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# --- pools and circuits ---------------------------------------------------------------------


class AuditedEditAdmin(admin.ModelAdmin):
    """A pool's or circuit's edit here is audited like every other operator change."""

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        kind = obj._meta.model_name
        details = {kind: obj.name, "fields": list(form.changed_data)}
        actions.record_edit(request.user, "", f"admin_{'change' if change else 'add'}_{kind}", details)


@admin.register(Pool)
class PoolAdmin(AuditedEditAdmin):
    """Pools made here or with `manage.py set_pool`; tasks name them with `pool:`."""

    list_display = ("name", "slots", "description")
    search_fields = ("name", "description")


@admin.register(Circuit)
class CircuitAdmin(AuditedEditAdmin):
    """The tunables may be changed here; the state moves by the rules or by the API's open/close/probe."""

    list_display = ("name", "state", "opened_at", "closed_at")
    list_filter = ("state",)
    search_fields = ("name",)
    fields = ("name", "state", "opened_at", "closed_at", "window", "min_attempts", "failure_rate", "cooldown", "ramp")
    readonly_fields = ("state", "opened_at", "closed_at")
