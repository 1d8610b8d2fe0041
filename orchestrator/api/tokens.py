"""Bearer tokens for API clients: only the SHA-256 of a key is stored, the key is shown once."""
from __future__ import annotations

import functools
import hashlib
import json
import secrets
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import FieldDoesNotExist
from django.db import connection
from django.http import HttpRequest
from django.utils import timezone

from orchestrator.data import sql
from orchestrator.models import ApiToken

BEARER_PREFIX = "bearer "
LAST_USED_RESOLUTION = timedelta(minutes=1)


class InvalidToken(Exception):
    """The request carried an Authorization header that names no active user."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_token(user: User) -> str:
    """Store a new token for `user` and return its key; the key cannot be recovered later."""
    key = secrets.token_urlsafe(32)
    ApiToken.objects.create(user=user, key_hash=hash_key(key))
    return key


def bearer_key(request: HttpRequest) -> str | None:
    """The key of an `Authorization: Bearer KEY` header, or None when there is no such header."""
    header = request.headers.get("Authorization", "")
    if not header:
        return None
    if not header.lower().startswith(BEARER_PREFIX):
        raise InvalidToken("the Authorization header must be 'Bearer TOKEN'")
    key = header[len(BEARER_PREFIX):].strip()
    if not key:
        raise InvalidToken("the Authorization header has an empty token")
    return key


def user_for_key(key: str, *, with_permissions: bool = False) -> AbstractBaseUser:
    """The active user owning `key` (`with_permissions`: read with them, for a check to come);
    records when the token was last used, to the minute (a write on every request would cost
    each API call a round trip and a commit)."""
    token = _token_with_user(hash_key(key), with_permissions)
    if token is None or not token.user.is_active:
        raise InvalidToken("invalid or revoked API token")
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user


def _token_with_user(key_hash: str, with_permissions: bool = False) -> ApiToken | None:
    """The token of that hash with its user (`with_permissions`: and the user's permissions), in
    one read. Written SQL: every request of the API pays for it, and the ORM took longer to build
    it than the database to answer; the permissions would have been two more reads (Django's
    ModelBackend reads the user's own and its groups' when the first is checked, and keeps them
    on the user)."""
    user_model = get_user_model()
    token_fields, user_fields = sql.concrete_fields(ApiToken), sql.concrete_fields(user_model)
    permissions = _permission_columns(user_model, connection.vendor) if with_permissions else ""
    rows = sql.fetch(
        f"SELECT {sql.columns('t', token_fields)}, {sql.columns('u', user_fields)}{permissions} FROM {ApiToken._meta.db_table} t"
        f" JOIN {user_model._meta.db_table} u ON u.{connection.ops.quote_name(user_model._meta.pk.column)} = t.user_id WHERE t.key_hash = %s",
        [key_hash],
        token_fields + user_fields,
        prepare=True,  # by its unique key, on every request: planned once per connection
    )
    if not rows:
        return None
    row = rows[0]
    token = sql.instances(ApiToken, token_fields, row[: len(token_fields)])
    token.user = sql.instances(user_model, user_fields, row[len(token_fields) : len(token_fields) + len(user_fields)])
    if permissions:
        own, of_groups = (_names(value) for value in row[len(token_fields) + len(user_fields) :])
        # Where ModelBackend keeps what it read (its permission caching), so it reads nothing.
        user: Any = token.user
        user._user_perm_cache = own
        user._group_perm_cache = of_groups
        user._perm_cache = own | of_groups
    return token


@functools.lru_cache(maxsize=4)
def _permission_columns(user_model: Any, vendor: str) -> str:
    """Two more columns for `_token_with_user`: the user's own permissions and its groups', each
    a JSON array of "app_label.codename", as ModelBackend names them; none for a user model
    without Django's permissions. Written once per process (and database vendor)."""
    try:
        own_field: Any = user_model._meta.get_field("user_permissions")
        groups_field: Any = user_model._meta.get_field("groups")
    except FieldDoesNotExist:
        return ""
    group_field: Any = Group._meta.get_field("permissions")
    quote = connection.ops.quote_name
    aggregate = "json_agg" if vendor == "postgresql" else "json_group_array"
    name = f"{aggregate}(ct.{quote('app_label')} || '.' || p.{quote('codename')})"
    named = (
        f"SELECT {name} FROM {quote(Permission._meta.db_table)} p"
        f" JOIN {quote(ContentType._meta.db_table)} ct ON ct.{quote('id')} = p.{quote('content_type_id')} WHERE p.{quote('id')} IN"
    )
    own_table = own_field.remote_field.through._meta.db_table
    own = f"SELECT o.{quote(own_field.m2m_reverse_name())} FROM {quote(own_table)} o WHERE o.{quote(own_field.m2m_column_name())} = u.{quote(user_model._meta.pk.column)}"
    member_table = groups_field.remote_field.through._meta.db_table
    granted_table = group_field.remote_field.through._meta.db_table
    of_groups = (
        f"SELECT g.{quote(group_field.m2m_reverse_name())} FROM {quote(granted_table)} g JOIN {quote(member_table)} m"
        f" ON m.{quote(groups_field.m2m_reverse_name())} = g.{quote(group_field.m2m_column_name())}"
        f" WHERE m.{quote(groups_field.m2m_column_name())} = u.{quote(user_model._meta.pk.column)}"
    )
    return f", ({named} ({own})), ({named} ({of_groups}))"


def _names(value: Any) -> set[str]:
    """A JSON array of permission names (a list on PostgreSQL, its text on SQLite; NULL: none)."""
    if value is None:
        return set()
    return set(json.loads(value) if isinstance(value, str) else value)
