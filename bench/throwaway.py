"""A PostgreSQL database and a Redis database that a benchmark creates for itself and removes."""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

CLAIM_KEY = "orchestrator-bench-claim"


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


@contextmanager
def throwaway_postgres(server_url: str, prefix: str, *, keep: bool = False) -> Iterator[str]:
    """A new database on `server_url`'s server, dropped at the end (unless `keep`)."""
    import psycopg

    if urlsplit(server_url).scheme not in ("postgres", "postgresql", "pgsql"):
        sys.exit(f"DATABASE_URL must be a PostgreSQL URL, not {urlsplit(server_url).scheme!r}")
    name = f"{prefix}_{int(time.time())}_{os.getpid()}"
    admin_url = with_database(server_url, "postgres")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(server_url, name)
    finally:
        if keep:
            print(f"kept database {with_database(server_url, name)}")
        else:
            from django.core.exceptions import ImproperlyConfigured
            from django.db import connections

            try:
                connections.close_all()
            except ImproperlyConfigured:  # stopped before Django was set up: nothing to close
                pass
            with psycopg.connect(admin_url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            print(f"dropped database {name}")


@contextmanager
def claimed_redis(base_url: str) -> Iterator[str]:
    """An empty Redis database (1-15) on the server, claimed with a marker and flushed at the end."""
    import redis

    parts = urlsplit(base_url)
    server = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
    marker = f"bench-{os.getpid()}"
    for db in range(1, 16):
        client = redis.Redis.from_url(f"{server}/{db}")
        if client.dbsize() == 0 and client.set(CLAIM_KEY, marker, nx=True, ex=7200):
            if client.dbsize() == 1:
                break
            client.delete(CLAIM_KEY)
    else:
        sys.exit("no empty Redis database (1-15) to run the benchmark in")
    try:
        yield f"{server}/{db}"
    finally:
        # Only the database this benchmark claimed, and only while the claim is still ours.
        if (client.get(CLAIM_KEY) or b"").decode() == marker:
            client.flushdb()
            print(f"flushed Redis database {db}")


@contextmanager
def migrated_django(prefix: str) -> Iterator[None]:
    """This process's Django set up on a throwaway PostgreSQL database (on DATABASE_URL's server)
    and a claimed Redis database (on REDIS_URL's), migrated; both removed at the end."""
    from django.core.management import call_command

    from bench.stack import child_env, setup_django

    server_url = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
    with throwaway_postgres(server_url, prefix) as db_url, \
            claimed_redis(os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379") as redis_url:
        setup_django(child_env(db_url, redis_url))
        call_command("migrate", verbosity=0)
        yield
