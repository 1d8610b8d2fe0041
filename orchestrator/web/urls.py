"""Operator pages (login required)."""
from django.urls import path

from orchestrator.operations.action_registry import APPROVAL_ACTIONS, BACKFILL_ACTIONS, TASK_ACTIONS
from orchestrator.web import alerts, approvals, backfill_pages, views

app_name = "web"

RUN = "dags/<str:dag_id>/runs/<str:run_id>"

urlpatterns = [
    path("", views.dag_list, name="dag_list"),
    path("dags/<str:dag_id>/", views.dag_detail, name="dag_detail"),
    path("dags/<str:dag_id>/trigger", views.dag_trigger, name="dag_trigger"),
    path("dags/<str:dag_id>/pause", views.dag_pause, name="dag_pause"),
    path("dags/<str:dag_id>/backfill", backfill_pages.backfill_new, name="backfill_new"),
    path("backfills/<str:backfill_id>/", backfill_pages.backfill_detail, name="backfill_detail"),
    *[
        path(f"backfills/<str:backfill_id>/{action}", backfill_pages.backfill_action, {"action": action}, name=f"backfill_{action}")
        for action in BACKFILL_ACTIONS
    ],
    path(f"{RUN}/", views.run_detail, name="run_detail"),
    path(f"{RUN}/clear_failed", views.run_clear_failed, name="run_clear_failed"),
    path(f"{RUN}/tasks/<str:task_id>", views.task_detail, name="task_detail"),
    path(f"{RUN}/tasks/<str:task_id>/attempts/<int:token>/<str:stream>.txt", views.task_output, name="task_output"),
    path(f"{RUN}/tasks/<str:task_id>/attempts/<int:token>/<str:stream>.log", views.task_output_file, name="task_output_file"),
    *[
        path(f"{RUN}/tasks/<str:task_id>/{action}", views.task_action, {"action": action}, name=f"task_{action}")
        for action in TASK_ACTIONS
    ],
    path("failures/", views.failures, name="failures"),
    path("alerts/", alerts.alerts, name="alerts"),
    path("approvals/", approvals.approvals, name="approvals"),
    *[
        path(f"{RUN}/tasks/<str:task_id>/{action}", approvals.decide, {"action": action}, name=f"task_{action}")
        for action in APPROVAL_ACTIONS
    ],
    path("fingerprints/<str:fingerprint>/", views.fingerprint, name="fingerprint"),
    path("dead-letters/", views.dead_letters, name="dead_letters"),
    path("dead-letters/act", views.dead_letter_action, name="dead_letter_action"),
    path("workers/", views.workers, name="workers"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("audit/", views.audit_log, name="audit_log"),
    # Any other /api/ path answers like the API does (401 JSON when anonymous), not with a page.
]
