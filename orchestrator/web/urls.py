"""Operator pages (login required)."""
from django.urls import path

urlpatterns: list = []
