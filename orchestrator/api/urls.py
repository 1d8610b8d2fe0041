"""JSON API v1 (session or bearer token)."""
from django.urls import path

urlpatterns: list = []
