"""Personas: alice the operator (may trigger, act on tasks and pause DAGs), bob the viewer (logged in, no permissions),
and anonymous. Imported by the conftest files of the API, web and browser tests."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def fast_password_hasher(settings) -> None:
    """Hashing a test password with the production work factor costs a second per user."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def alice(db) -> User:
    user = User.objects.create_user("alice", "alice@example.com", PASSWORD)
    user.user_permissions.add(
        Permission.objects.get(codename="trigger_dagrun", content_type__app_label="orchestrator"),
        Permission.objects.get(codename="change_taskinstance", content_type__app_label="orchestrator"),
        Permission.objects.get(codename="change_dag", content_type__app_label="orchestrator"),
    )
    return User.objects.get(pk=user.pk)  # a fresh object: no stale permission cache


@pytest.fixture
def bob(db) -> User:
    return User.objects.create_user("bob", "bob@example.com", PASSWORD)


@pytest.fixture
def alice_client(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def bob_client(bob) -> Client:
    client = Client()
    client.force_login(bob)
    return client


@pytest.fixture
def anonymous_client(db) -> Client:
    return Client()
