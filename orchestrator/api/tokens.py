"""Bearer tokens for API clients: only the SHA-256 of a key is stored, the key is shown once."""
from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, User
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


def user_for_key(key: str) -> AbstractBaseUser:
    """The active user owning `key`; records when the token was last used, to the minute (a write
    on every request would cost each API call a round trip and a commit)."""
    token = _token_with_user(hash_key(key))
    if token is None or not token.user.is_active:
        raise InvalidToken("invalid or revoked API token")
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user


def _token_with_user(key_hash: str) -> ApiToken | None:
    """The token of that hash with its user, in one read. Written SQL: every request of the API
    pays for it, and the ORM took longer to build it than the database to answer."""
    user_model = get_user_model()
    token_fields, user_fields = sql.concrete_fields(ApiToken), sql.concrete_fields(user_model)
    rows = sql.fetch(
        f"SELECT {sql.columns('t', token_fields)}, {sql.columns('u', user_fields)} FROM {ApiToken._meta.db_table} t"
        f" JOIN {user_model._meta.db_table} u ON u.{connection.ops.quote_name(user_model._meta.pk.column)} = t.user_id WHERE t.key_hash = %s",
        [key_hash],
        token_fields + user_fields,
    )
    if not rows:
        return None
    token = sql.instances(ApiToken, token_fields, rows[0][: len(token_fields)])
    token.user = sql.instances(user_model, user_fields, rows[0][len(token_fields) :])
    return token
