"""Alert rules, edited with the same validation as a rules file; incidents, for browsing.

The rule's form shows notify_kwargs masked (`alerts.masking`); saving a masked value back keeps
the stored one.
"""
from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from alerts import masking, rules_cache, spec
from alerts.models import AlertRule, Incident

LIST_HELP = "A JSON list, e.g. [\"payments.*\"]; empty: any."


class AlertRuleForm(forms.ModelForm):
    class Meta:
        model = AlertRule
        fields = spec.KEYS
        help_texts = {
            "category": LIST_HELP,
            "reason": LIST_HELP,
            "dag_id": "Shell-style patterns, as a JSON list; empty: any.",
            "task_id": "Shell-style patterns, as a JSON list; empty: any.",
            "owner": LIST_HELP,
            "notify_kwargs": 'JSON, e.g. {"url": "https://hooks.example/...", "format": "slack"}. Secret-looking values are shown '
            "masked; leave a masked value as it is to keep it.",
            "group_by": "A JSON list of dag_id, task_id, owner, category, reason, fingerprint, queue.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.initial["notify_kwargs"] = masking.mask(self.instance.notify_kwargs)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        raw = {key: data.get(key) for key in spec.KEYS}
        stored = AlertRule.objects.filter(pk=self.instance.pk).values_list("notify_kwargs", flat=True).first() if self.instance.pk else None
        fields, problems = spec.validate(raw, stored)
        for path, message in problems.items:
            name = path.split(".", 1)[0].split("[", 1)[0]
            self.add_error(name if name in self.fields else None, f"{path}: {message}" if path != name else message)
        if not problems:
            data.update(fields)
        return data


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    form = AlertRuleForm
    list_display = ("name", "when", "notify", "repeat_after", "resolve", "updated_at")
    list_filter = ("when", "resolve")
    search_fields = ("name", "notify")

    def save_model(self, request: HttpRequest, obj: AlertRule, form: Any, change: bool) -> None:
        for key, value in form.cleaned_data.items():
            if key in spec.KEYS:
                setattr(obj, key, value)
        super().save_model(request, obj, form, change)
        rules_cache.invalidate()

    def delete_model(self, request: HttpRequest, obj: AlertRule) -> None:
        super().delete_model(request, obj)
        rules_cache.invalidate()


@admin.register(Incident)
class IncidentAdmin(admin.ModelAdmin):
    list_display = ("id", "rule", "state", "count", "first_event_at", "last_event_at", "resolved_at")
    list_filter = ("state", "rule")
    list_select_related = ("rule",)
    fields = ("rule", "group", "state", "count", "first_event_at", "last_event_at", "resolved_at", "sample")
    readonly_fields = fields

    # Incidents change through events and the sender only.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
