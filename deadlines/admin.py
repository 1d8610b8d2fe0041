"""Deadline instances, for browsing; their definitions are edited on the DAG and task pages."""
from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from deadlines.models import Deadline


@admin.register(Deadline)
class DeadlineAdmin(admin.ModelAdmin):
    list_display = (
        "dag_run",
        "scope",
        "task_id",
        "reference",
        "need_by",
        "state",
        "callback_state",
        "lateness_seconds",
    )
    list_filter = ("state", "scope", "reference", "callback_state")
    search_fields = ("dag_run__run_id", "dag_run__dag__dag_id", "task_id")
    list_select_related = ("dag_run__dag",)
    date_hierarchy = "need_by"

    # Deadlines change through the periodic check only.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
