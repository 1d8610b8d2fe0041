"""JSON API v1 (session or bearer token).

Every view here is declared with `endpoint(Operation(...))`; a route and its Operation's path
name the same URL (tests/api/test_openapi.py checks that they do).
"""
from django.urls import path

from orchestrator.actions import TASK_ACTIONS
from orchestrator.api import backfills, deadline_history, openapi, pools_and_circuits, views, workers_and_dead_letters

app_name = "api"

# run_id holds ':' and '+' (e.g. manual__2026-01-01T00:00:00+00:00); <str:...> takes any path
# segment and Django decodes %2B without turning a '+' into a space.
RUN = "dags/<str:dag_id>/runs/<str:run_id>"

urlpatterns = [
    path("openapi.json", openapi.openapi_view, name="openapi"),
    path("dags", views.dag_list, name="dag_list"),
    path("dags/<str:dag_id>", views.dag_detail, name="dag_detail"),
    path("dags/<str:dag_id>/runs", views.dag_runs, name="dag_runs"),
    path(RUN, views.run_detail, name="run_detail"),
    *[
        path(f"{RUN}/tasks/<str:task_id>/{action}", views.TASK_ACTION_VIEWS[action], {"action": action}, name=f"task_{action}")
        for action in TASK_ACTIONS
    ],
    path("dags/<str:dag_id>/backfills", backfills.create_backfill, name="backfill_create"),
    path("backfills/<str:id>", backfills.backfill_detail, name="backfill_detail"),
    *[
        path(f"backfills/<str:id>/{action}", backfills.BACKFILL_ACTION_VIEWS[action], name=f"backfill_{action}")
        for action in backfills.BACKFILL_ACTIONS
    ],
    path("dags/<str:dag_id>/deadlines/history", deadline_history.history_view, name="deadline_history"),
    path("failures", views.failures, name="failures"),
    path("dead_letters", workers_and_dead_letters.dead_letters, name="dead_letters"),
    path("workers", workers_and_dead_letters.workers, name="workers"),
    path("pools", pools_and_circuits.pool_list, name="pools"),
    path("circuits", pools_and_circuits.circuit_list, name="circuits"),
    *[
        path(f"circuits/<str:name>/{action}", pools_and_circuits.CIRCUIT_ACTION_VIEWS[action], name=f"circuit_{action}")
        for action in pools_and_circuits.CIRCUIT_ACTIONS
    ],
]
