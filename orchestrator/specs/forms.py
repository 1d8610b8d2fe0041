"""Admin forms that hold a DAG edited in the browser to the rules of an imported file.

Every form and formset here turns what was typed into a raw spec and runs the same
validator as `import_dags` (`orchestrator.specs.schema`), then shows each problem on
the field it names.
"""
from __future__ import annotations

import re
from typing import Any, Generic, TypeVar

from django import forms
from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.forms.models import BaseInlineFormSet

from deadlines.models import (
    DAG_REFERENCES,
    TASK_REFERENCES,
    DeadlineDefinition,
    Reference,
)
from orchestrator.models import Dag, Task
from orchestrator.specs.errors import Problem
from orchestrator.specs.exporter import task_spec
from orchestrator.specs.pools import default_pool_problems, unknown_pool_problems
from orchestrator.specs.schema import (
    ARG_KEYS,
    DAG_KEYS,
    LIMIT_KEYS,
    validate_dag,
    validate_deadline_list,
)

# What the task form's JSON "Other overrides" may hold: default_args keys and the limit keys.
OVERRIDE_KEYS = ARG_KEYS + LIMIT_KEYS
LIST_SEPARATOR = re.compile(r"[\s,]+")
PATH_HEAD = re.compile(r"[.\[]")
TASK_PATH = re.compile(r"^tasks\[(\d+)\]")
DEADLINE_PATH = re.compile(r"^deadlines\[(\d+)\]")
# A placeholder id for validating tasks or deadlines apart from their DAG.
PLACEHOLDER_DAG_ID = "dag"
SMALL_JSON = forms.Textarea(attrs={"rows": 2, "cols": 28})


def split_list(text: str | None) -> list[str]:
    """`"a, b c"` -> `["a", "b", "c"]`."""
    return [item for item in LIST_SEPARATOR.split(text or "") if item]


def add_problems(
    form: forms.BaseForm, problems: list[Problem], prefix: str = "", aliases: dict[str, str] | None = None
) -> None:
    """Attach each problem (its path under `prefix`) to the form field it names, else to the form."""
    aliases = aliases or {}
    for problem in problems:
        rest = problem.path[len(prefix) :].lstrip(".")
        head = PATH_HEAD.split(rest, maxsplit=1)[0]
        if head in form.errors:
            continue  # the field's own check already said what is wrong with it
        if head in form.fields:
            # A nested path keeps its full name: "callback_kwargs.url: ...", "days[1]: ...".
            form.add_error(head, str(Problem(rest, problem.message)) if rest != head else problem.message)
        elif head in aliases:
            form.add_error(aliases[head], str(Problem(rest, problem.message)))
        else:
            form.add_error(None, str(Problem(rest, problem.message)))


def json_mapping(value: Any) -> Any:
    """An empty JSON input means `{}`; anything else (a list, a string) is kept for the validator to judge."""
    return {} if value is None else value


RowForm = TypeVar("RowForm", bound=forms.ModelForm)


class KeptFormsMixin(Generic[RowForm]):
    """For inline formsets: the forms that will be saved, in display order."""

    def kept_forms(self) -> list[RowForm]:
        kept = []
        # `forms` and `_should_delete_form` are the inline formset's this class is mixed into.
        for form in self.forms:  # type: ignore[attr-defined]  # the formset mixed with this class has it
            if not hasattr(form, "cleaned_data") or self._should_delete_form(form):  # type: ignore[attr-defined]  # likewise
                continue
            if form.instance.pk is None and not form.has_changed():
                continue  # an untouched extra row
            kept.append(form)
        return kept


# --- DAG ---------------------------------------------------------------------------------

# Every DAG key of a spec file but the nested lists, which have inlines of their own.
DAG_FORM_FIELDS = tuple(key for key in DAG_KEYS if key not in ("deadlines", "tasks"))


class DagForm(forms.ModelForm):
    class Meta:
        model = Dag
        fields = DAG_FORM_FIELDS
        help_texts = {
            "timezone": "IANA name, e.g. Europe/Amsterdam.",
            "default_args": "JSON defaults for every task, e.g. {\"retries\": 3, \"execution_timeout\": 30}.",
            "params": "JSON: NAME -> a JSON Schema with an optional default and description, e.g. "
            "{\"team\": {\"type\": \"string\", \"default\": \"data\"}}.",
        }

    def clean_default_args(self) -> Any:
        return json_mapping(self.cleaned_data.get("default_args"))

    def clean_params(self) -> Any:
        return json_mapping(self.cleaned_data.get("params"))

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        raw = {key: cleaned[key] for key in DAG_FORM_FIELDS if key in cleaned}
        raw["schedule"] = raw.get("schedule") or None
        _, problems = validate_dag(raw)
        if not problems:
            problems = default_pool_problems(raw.get("default_args"))
        add_problems(self, problems)
        return cleaned


# --- tasks -------------------------------------------------------------------------------

# default_args keys with a field of their own on the task form; the rest go in `args` as JSON.
TYPED_ARGS = ("retries", "execution_timeout", "queue")
TASK_KEYS = ("task_id", "python_callable", "bash_command", "wait_for", "op_kwargs", "upstream", "trigger_rule")


def dag_context(dag: Dag | None) -> dict[str, Any]:
    """The DAG keys a task is validated against: its default_args (a task's memory_limit_on_retry
    may step up from the DAG's memory_limit) and its timezone. On the DAG's own page these are
    what was typed (the DAG form, validated first, sets them on the instance when they are valid)."""
    if dag is None:
        return {"dag_id": PLACEHOLDER_DAG_ID}
    default_args = dag.default_args if isinstance(dag.default_args, dict) else {}
    return {"dag_id": PLACEHOLDER_DAG_ID, "default_args": default_args, "timezone": dag.timezone or "UTC"}


class TaskForm(forms.ModelForm):
    # Declared, not generated: the generated field of a model field with a callable default
    # expects a hidden "initial" input, without which a blank extra row counts as changed.
    op_kwargs = forms.JSONField(
        required=False, initial=dict, widget=SMALL_JSON, help_text="Keyword arguments for the callable, as JSON."
    )
    wait_for = forms.JSONField(
        required=False,
        widget=SMALL_JSON,
        label="Wait for",
        help_text="Instead of a callable or command: what the scheduler waits for, as JSON with exactly one kind, "
        'e.g. {"event": {"name": "orders_landed"}}; its poke_interval and wait_timeout go in the overrides.',
    )
    upstream = forms.CharField(required=False, help_text="Task ids of this DAG, comma-separated.")
    retries = forms.IntegerField(required=False, min_value=0, help_text="Overrides the DAG's default_args.")
    execution_timeout = forms.FloatField(required=False, min_value=0, label="Execution timeout (s)")
    queue = forms.CharField(required=False, max_length=100)
    args = forms.JSONField(
        required=False,
        widget=SMALL_JSON,
        label="Other overrides",
        help_text="Other default_args keys for this task only, and its pool, pool_slots, priority_weight, "
        "max_active_tis_per_dag, max_active_tis_per_dagrun and circuit, as JSON, e.g. {\"retry_delay\": 5, \"pool\": \"warehouse\"}.",
    )

    class Meta:
        model = Task
        fields: tuple[str, ...] = TASK_KEYS + TYPED_ARGS + ("args",)
        widgets = {"bash_command": forms.TextInput(attrs={"size": 40})}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        stored = dict(self.instance.args or {})
        for key in TYPED_ARGS:
            if stored.get(key) is not None:  # an explicit null (no timeout) stays in the JSON
                self.initial[key] = stored.pop(key)
        self.initial["args"] = stored
        self.initial["upstream"] = ", ".join(self.instance.upstream or [])

    def clean_upstream(self) -> list[str]:
        return split_list(self.cleaned_data.get("upstream"))

    def clean_op_kwargs(self) -> Any:
        return json_mapping(self.cleaned_data.get("op_kwargs"))

    def clean_execution_timeout(self) -> float | int | None:
        value = self.cleaned_data.get("execution_timeout")
        return int(value) if value is not None and value.is_integer() else value

    def clean_args(self) -> dict[str, Any]:
        value = json_mapping(self.cleaned_data.get("args"))
        if not isinstance(value, dict):
            raise ValidationError("Must be a JSON object.")
        unknown = [key for key in value if key not in OVERRIDE_KEYS]
        if unknown:
            raise ValidationError(f"Unknown key {unknown[0]!r}; allowed: {', '.join(OVERRIDE_KEYS)}.")
        return value

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        # Fold the typed fields into `args`, the JSON column that holds the task's overrides.
        args = cleaned.get("args")
        if isinstance(args, dict):
            merged = dict(args)
            for key in TYPED_ARGS:
                value = cleaned.get(key)
                if value is None or value == "":
                    continue
                if key in args:
                    self.add_error(key, f"Also set in {self.fields['args'].label}; set it in one place.")
                merged[key] = value
            cleaned["args"] = merged
            for problem in unknown_pool_problems([{"task_id": cleaned.get("task_id"), "args": merged}]):
                self.add_error("args", problem.message)
        return cleaned

    def raw_spec(self) -> dict[str, Any]:
        """This task as a spec entry, from the cleaned data."""
        cleaned = self.cleaned_data
        raw: dict[str, Any] = dict(cleaned.get("args") or {})
        for key in TASK_KEYS:
            value = cleaned.get(key)
            if value is not None and value != "":
                raw[key] = value
        # A form without the expand field (the DAG page's inline) keeps what is stored.
        expand = cleaned.get("expand") if "expand" in self.fields else self.instance.expand
        if expand not in (None, "", {}):
            raw["expand"] = expand
        return raw

    def show_problems(self, problems: list[Problem], prefix: str) -> None:
        aliases = {key: "args" for key in OVERRIDE_KEYS if key not in self.fields}
        add_problems(self, problems, prefix, aliases)


class TaskInlineFormSet(KeptFormsMixin[TaskForm], BaseInlineFormSet):
    """The tasks of one DAG: checked together for duplicate ids, unknown upstreams and cycles."""

    def clean(self) -> None:
        super().clean()
        kept = self.kept_forms()
        if any(form.errors for form in kept):
            return  # fix the fields first; graph problems may be consequences
        dag = self.instance if isinstance(self.instance, Dag) else None
        _, problems = validate_dag({**dag_context(dag), "tasks": [form.raw_spec() for form in kept]})
        whole: list[str] = []
        for problem in problems:
            match = TASK_PATH.match(problem.path)
            if match:
                kept[int(match[1])].show_problems([problem], match[0])
            else:
                whole.append(str(problem))
        if whole:
            raise ValidationError(whole)


class StandaloneTaskForm(TaskForm):
    """One task edited on its own page: checked against the other tasks of its DAG."""

    expand = forms.JSONField(
        required=False,
        widget=SMALL_JSON,
        help_text='A mapped task: {"NAME": [items]} or {"NAME": "results.UPSTREAM_ID"}, one instance per item; empty: not mapped.',
    )

    class Meta(TaskForm.Meta):
        fields = ("dag",) + TASK_KEYS + ("expand",) + TYPED_ARGS + ("args", "position")

    def clean_expand(self) -> Any:
        value = self.cleaned_data.get("expand")
        return None if value in (None, "", {}) else value

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        dag = cleaned.get("dag") or (self.instance.dag if self.instance.dag_id else None)
        if dag is None or self.errors:
            return cleaned
        others = [task_spec(task) for task in dag.tasks.exclude(pk=self.instance.pk)]
        for other in others:
            other.pop("deadlines", None)  # stored and checked already; not this form's business
        mine = len(others)
        _, problems = validate_dag({**dag_context(dag), "tasks": [*others, self.raw_spec()]})
        for problem in problems:
            match = TASK_PATH.match(problem.path)
            if match is None:
                self.add_error(None, str(problem))
            elif int(match[1]) == mine:
                self.show_problems([problem], match[0])
            elif problem.path.endswith((".upstream", ".task_id")):
                # Another task now points at a name this form removed, or closes a cycle through it.
                name = others[int(match[1])]["task_id"]
                field = problem.path[len(match[0]) :].lstrip(".")
                self.add_error(None, f"task {name!r}: {Problem(field, problem.message)}")
        return cleaned


# --- deadlines -----------------------------------------------------------------------------


class DeadlineForm(forms.ModelForm):
    callback_kwargs = forms.JSONField(
        required=False, initial=dict, help_text='JSON, e.g. {"url": "https://..."} for notifier:webhook.'
    )
    datetime_text = forms.CharField(
        required=False,
        label="Datetime",
        help_text="Only for fixed_datetime: ISO 8601; without an offset it is in the DAG's timezone.",
    )
    days = forms.CharField(required=False, help_text="e.g. mon, tue, wed; empty = every day.")
    skip_dates = forms.CharField(required=False, help_text="ISO dates, comma-separated.")

    references: frozenset[Reference] = DAG_REFERENCES

    class Meta:
        model = DeadlineDefinition
        fields = ("reference", "interval", "datetime_text", "callback", "callback_kwargs", "warn", "days", "skip_dates")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        reference = self.fields["reference"]
        assert isinstance(reference, forms.ChoiceField)  # a model field with choices makes one
        reference.choices = [("", "---------")] + [(ref.value, ref.label) for ref in Reference if ref in self.references]
        self.initial["days"] = ", ".join(self.instance.days or [])
        self.initial["skip_dates"] = ", ".join(self.instance.skip_dates or [])

    def clean_days(self) -> list[str]:
        return split_list(self.cleaned_data.get("days"))

    def clean_skip_dates(self) -> list[str]:
        return split_list(self.cleaned_data.get("skip_dates"))

    def clean_callback_kwargs(self) -> Any:
        return json_mapping(self.cleaned_data.get("callback_kwargs"))

    def raw_spec(self) -> dict[str, Any]:
        cleaned = self.cleaned_data
        keys = ("reference", "interval", "callback", "callback_kwargs", "warn", "days", "skip_dates")
        raw = {key: cleaned[key] for key in keys if key in cleaned}
        if cleaned.get("datetime_text"):
            raw["datetime"] = cleaned["datetime_text"]
        return raw


class TaskDeadlineForm(DeadlineForm):
    references = TASK_REFERENCES


class DeadlineInlineFormSet(KeptFormsMixin[DeadlineForm], BaseInlineFormSet):
    """Deadline definitions of a DAG (`task_level` False) or of one task."""

    task_level = False

    def dag_timezone(self) -> str:
        try:
            dag = self.instance.dag if self.task_level else self.instance
        except ObjectDoesNotExist:  # a new task whose DAG is not chosen yet
            return "UTC"
        return dag.timezone

    def clean(self) -> None:
        super().clean()
        kept = self.kept_forms()
        if any(form.errors for form in kept):
            return
        specs, problems = validate_deadline_list(
            [form.raw_spec() for form in kept], task_level=self.task_level, timezone=self.dag_timezone()
        )
        for problem in problems:
            match = DEADLINE_PATH.match(problem.path)
            if match:
                add_problems(kept[int(match[1])], [problem], match[0], {"datetime": "datetime_text"})
            else:
                raise ValidationError(str(problem))
        if not problems:
            for form, spec in zip(kept, specs):
                # Not form fields: computed from the text, as an import does.
                form.instance.datetime = spec["datetime"]
                form.instance.datetime_text = spec["datetime_text"]
                form.instance.skip_dates = spec["skip_dates"]


class TaskDeadlineInlineFormSet(DeadlineInlineFormSet):
    task_level = True
