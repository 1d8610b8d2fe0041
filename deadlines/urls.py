"""Deadline endpoints, mounted under /api/v1/ (before the rest of the API)."""
from django.urls import path

from deadlines import views

app_name = "deadlines"

urlpatterns = [
    path("dags/<str:dag_id>/deadlines/history", views.history_view, name="history"),
]
