"""Written SQL for the statements every attempt runs (claim, handshake, heartbeat, report).

Compiling a QuerySet costs several times what the database takes to run a one-row UPDATE; on
the worker's hot path that compiling was most of its CPU. These helpers build the few hot
statements directly, with Django's own adaptation of values (`get_db_prep_save`) and of results
(the backend's and the field's converters), so they stay portable to PostgreSQL and SQLite
(3.35+, for RETURNING) and read exactly what the ORM would.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections, models
from django.db.models.base import ModelState
from django.db.models.functions import Now
from django.db.models.signals import post_init, post_save, pre_init, pre_save

log = logging.getLogger(__name__)
R = TypeVar("R")


@functools.lru_cache(maxsize=4)
def _now_sql(vendor: str) -> str:
    """The database's clock, as `Now()` compiles on this backend (heartbeats use it so that
    workers and schedulers on different hosts compare times from one clock)."""
    from orchestrator.models import TaskInstance

    compiler = TaskInstance.objects.none().query.get_compiler(connection=connection)
    sql, params = compiler.compile(Now())
    assert not params
    return sql  # as the ORM writes it: ready for a statement with parameters


def now_sql() -> str:
    return _now_sql(connection.vendor)


def column_field(model: type[models.Model], name: str) -> models.Field:
    """The field of `model` named `name`, which must be one of its table's columns (not a
    reverse relation)."""
    field = model._meta.get_field(name)
    if not isinstance(field, models.Field):
        raise LookupError(f"{model.__name__}.{name} is not a column")
    return field


def assignments(model: type[models.Model], changes: dict[str, Any]) -> tuple[str, list[Any]]:
    """`col = %s, ...` and its parameters for an UPDATE of `model`; `Now()` is the database's clock."""
    names = tuple((name, isinstance(value, Now)) for name, value in changes.items())
    assigned, fields = _assignments_of(connection.vendor, model, names)
    values = [value for value in changes.values() if not isinstance(value, Now)]
    return assigned, [field.get_db_prep_save(value, connection) for field, value in zip(fields, values, strict=True)]


@functools.lru_cache(maxsize=256)
def _assignments_of(vendor: str, model: type[models.Model], names: tuple[tuple[str, bool], ...]) -> tuple[str, tuple[models.Field, ...]]:
    """The SQL of `assignments` for these columns (each with whether it takes the database's
    clock), and the fields whose values are its parameters: the same few statements run for
    every attempt, and building their text was a tenth of a report's time in the worker."""
    parts, fields = [], []
    for name, is_now in names:
        field = column_field(model, name)
        column = connection.ops.quote_name(field.column)
        if is_now:
            parts.append(f"{column} = {_now_sql(vendor)}")
        else:
            parts.append(f"{column} = %s")
            fields.append(field)
    return ", ".join(parts), tuple(fields)


def placeholders(n: int) -> str:
    return ", ".join(["%s"] * n)


def literals(names: Iterable[str]) -> str:
    """Constant names (states, kinds) written into a statement, for `IN (...)`: a prepared
    statement's plan, made once for any parameters, then still sees which values they are (and
    so which partial indexes serve it). Only for the code's own constants, never for input."""
    names = list(names)
    if not all(name.replace("_", "").isalnum() for name in names):
        raise ValueError(f"not a constant name: {names!r}")
    return ", ".join(f"'{name}'" for name in names)


def execute(sql: str, params: Sequence[Any] = (), *, prepare: bool = False) -> int:
    """Run a statement; return how many rows it changed. `prepare`: see `cursor`."""
    with cursor(prepare) as c:
        c.execute(sql, params)
        return c.rowcount


def fetch(sql: str, params: Sequence[Any], fields: Iterable[models.Field | None], *, prepare: bool = False) -> list[tuple]:
    """Run a query; each column is converted as the ORM converts `fields` (None: as it came).
    `prepare`: see `cursor`."""
    db = connections[DEFAULT_DB_ALIAS]  # this thread's connection, looked up once
    conversions = [(at, chain) for at, field in enumerate(fields) if (chain := _converters(db.ops, field))]
    with cursor(prepare) as c:
        c.execute(sql, params)
        rows = c.fetchall()
    if not conversions:
        return rows
    converted = []
    for row in rows:
        values = list(row)
        for at, chain in conversions:
            for converter, expression in chain:
                values[at] = converter(values[at], expression, db)
        converted.append(tuple(values))
    return converted


def cursor(prepare: bool = False) -> Any:
    """Django's cursor; with `prepare`, on PostgreSQL (unless ORCHESTRATOR_DB_PREPARED_STATEMENTS
    is off), one that binds its parameters on the server and prepares its statement, so that it
    is planned once per connection: planning a claim took three times as long as running it.

    Only for the few statements every attempt runs (its moves, a report's reads of the task it
    ended and of the few it may make ready, the dispatch), each binding only what varies: keys,
    times, task ids; the states it looks for are written in (`literals`). PostgreSQL soon plans
    a prepared statement once for any parameters and keeps that plan until the table's
    statistics change, so it must be as good for every value bound, and it sees no bound state.
    A plan made while a table was tiny reads it through as it grows (a move in a 20,000-task
    table took 2.9 ms, not 0.1): a big run has its tables analyzed (`engine/tablestats.py`).
    Preparing every statement doubled a 10,000-task run's database time. Django's wrapper stays
    around it (query logging, error translation)."""
    if not (prepare and connection.vendor == "postgresql" and settings.ORCHESTRATOR_DB_PREPARED_STATEMENTS):
        return connection.cursor()
    # As Django's own `cursor()` does, around a cursor of our class.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    with connection.wrap_database_errors:
        raw = _preparing_cursor_class()(connection.connection)
    return connection.make_debug_cursor(raw) if connection.queries_logged else connection.make_cursor(raw)


def is_stale_plan(error: BaseException) -> bool:
    """Whether `error` (Django's, or the driver's under it) is PostgreSQL refusing to run a
    prepared statement again because a schema change since it was prepared changed the type of
    what it returns (`cached plan must not change result type`, SQLSTATE 0A000, raised where the
    server revalidates a cached plan: a migration's ALTER COLUMN ... TYPE). The server never
    runs that statement again on that connection; prepared anew, it runs."""
    for candidate in (error, error.__cause__):
        if getattr(candidate, "sqlstate", None) == "0A000":
            diag = getattr(candidate, "diag", None)
            where = getattr(diag, "source_function", None) or ""
            message = getattr(diag, "message_primary", None) or str(candidate)
            return where == "RevalidateCachedQuery" or "cached plan must not change result type" in message
    return False


def _forget_prepared(raw: Any) -> None:
    """Drop every statement prepared on the psycopg connection `raw`, in psycopg's record and
    on the server. psycopg has no public call for its record; it keeps it per connection
    (`_prepared`), and clearing it queues a DEALLOCATE ALL that runs after the next statement:
    now when the connection is outside a transaction; in a failed one, after its rollback
    (which, on the server, keeps prepared statements)."""
    from psycopg.pq import TransactionStatus

    raw._prepared.clear()
    if raw.info.transaction_status == TransactionStatus.IDLE:
        raw.execute("DEALLOCATE ALL", prepare=False)


def once_more_if_stale(function: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """`function(*args, **kwargs)`, run once more when a prepared statement of it failed inside
    a transaction on a plan a schema change made stale (`is_stale_plan`): that transaction
    is rolled back and the connection's prepared statements with it (`PreparingCursor`), so
    the second run prepares them anew. (Outside a transaction the statement itself is run again:
    nothing reaches here.) For the worker's and the scheduler's calls, each of which may run
    again after any failure (a claim or report is fenced by its token)."""
    try:
        return function(*args, **kwargs)
    except DatabaseError as exc:
        if not is_stale_plan(exc) or connection.in_atomic_block:
            raise
        log.warning("a prepared statement's plan was made stale by a schema change; running %s once more", getattr(function, "__name__", function))
    return function(*args, **kwargs)


@functools.lru_cache(maxsize=1)
def _preparing_cursor_class() -> type:
    import psycopg

    class PreparingCursor(psycopg.Cursor):
        """Binds parameters on the server and prepares each statement it runs (psycopg keeps a
        connection's prepared statements, the least recently used dropped past 100).

        A statement whose plan a migration made stale (`is_stale_plan`) drops all the
        connection's prepared statements; outside a transaction it is then run again, at once;
        inside one it fails, and the transaction's caller runs it again (`once_more_if_stale`).
        Without this, a long-lived connection (a worker's, the scheduler's) would fail that
        statement for ever after an ALTER COLUMN ... TYPE."""

        def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None) -> Any:
            try:
                return super().execute(query, params, prepare=True, binary=binary)
            except psycopg.errors.FeatureNotSupported as exc:
                if not is_stale_plan(exc):
                    raise
                _forget_prepared(self.connection)
                if self.connection.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    raise
            return super().execute(query, params, prepare=True, binary=binary)

        def _send_query_prepared(self, name: bytes, pgq: Any, *, binary: bool | None = None) -> None:
            # Django's query log (DEBUG, tests) reads the statement from `_query`, which psycopg
            # sets only for a statement it does not prepare.
            self._query = pgq
            super()._send_query_prepared(name, pgq, binary=binary)

    return PreparingCursor


@functools.lru_cache(maxsize=1024)
def _converters(ops: Any, field: models.Field | None) -> tuple[tuple[Any, Any], ...]:
    """What the ORM calls on a value of `field` read through a connection with `ops` (each
    thread's connection has its own), with the expression it passes: worked out once, not for
    every column of every read (most of a report's reading was this, on PostgreSQL where nearly
    every column has none)."""
    if field is None:
        return ()
    expression = field.cached_col
    # django-stubs declare get_db_converters on expressions only; Django's Field has it too.
    chain = ops.get_db_converters(expression) + field.get_db_converters(ops.connection)  # type: ignore[attr-defined]  # see the comment above
    return tuple((converter, expression) for converter in chain)


def columns(alias: str, fields: Iterable[models.Field]) -> str:
    """`alias.col, ...` for a SELECT of `fields`."""
    return _columns(connection.vendor, alias, tuple(fields))


@functools.lru_cache(maxsize=256)
def _columns(vendor: str, alias: str, fields: tuple[models.Field, ...]) -> str:
    return ", ".join(f"{alias}.{connection.ops.quote_name(field.column)}" for field in fields)


M = TypeVar("M", bound=models.Model)


def insert(instance: models.Model) -> None:
    """Insert `instance`'s row, its primary key set, as `save(force_insert=True)` would (no
    signals are sent). On PostgreSQL one written INSERT, prepared: the ORM took longer to build
    it than the database to run it, for a row every action writes (its audit entry)."""
    model = type(instance)
    if connection.vendor != "postgresql" or pre_save.has_listeners(model) or post_save.has_listeners(model):
        instance.save(force_insert=True)
        return
    statement, params = insert_statement(instance)
    inserted(instance, fetch(statement, params, [None], prepare=True)[0][0])


def insert_statement(instance: models.Model) -> tuple[str, list[Any]]:
    """An INSERT of `instance`'s row as the ORM's would be (its defaults and `auto_now` filled),
    returning its primary key, and its parameters."""
    model = type(instance)
    fields = tuple(field for field in concrete_fields(model) if not field.primary_key)
    return _insert_sql(model, fields), [field.get_db_prep_save(field.pre_save(instance, True), connection) for field in fields]


def inserted(instance: models.Model, pk: Any) -> None:
    """`instance` as a saved one, its row inserted with primary key `pk`."""
    instance.pk = pk
    instance._state.adding, instance._state.db = False, connection.alias


@functools.lru_cache(maxsize=32)
def _insert_sql(model: type[models.Model], fields: tuple[models.Field, ...]) -> str:
    quote = connection.ops.quote_name
    return (
        f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(field.column) for field in fields)})"
        f" VALUES ({placeholders(len(fields))}) RETURNING {quote(model._meta.pk.column)}"
    )


def instances(model: type[M], fields: Sequence[models.Field], values: Sequence[Any]) -> M:
    """A model instance from already converted column values, as the ORM builds one (fields not
    given are deferred: reading one queries it). For many rows, `builder`."""
    return builder(model, fields)(values)


def builder(model: type[M], fields: Sequence[models.Field]) -> Callable[[Sequence[Any]], M]:
    """What builds `instances` of `model` from rows of `fields`, its look at the model done once
    for all the rows of one read (a run's 10,000).

    Built as `Model.from_db` would leave it, without running `Model.__init__` (its checks of
    every field cost more than the query when a run's 10,000 rows are read); a model with its
    own `from_db` or init signals is built by the ORM."""
    attnames = [field.attname for field in fields]
    alias = connection.alias
    if model.from_db.__func__ is not _BASE_FROM_DB or pre_init.has_listeners(model) or post_init.has_listeners(model):  # type: ignore[attr-defined]  # a classmethod has __func__; the stubs do not say
        return lambda values: model.from_db(alias, attnames, values)

    def build(values: Sequence[Any]) -> M:
        instance = model.__new__(model)
        state = ModelState()
        state.adding, state.db = False, alias
        instance._state = state
        instance.__dict__.update(zip(attnames, values))
        return instance

    return build


_BASE_FROM_DB = models.Model.from_db.__func__  # type: ignore[attr-defined]  # likewise


def concrete_fields(model: type[models.Model], names: Iterable[str] | None = None) -> list[models.Field]:
    """The model's columns (all, or those named): its concrete fields, which are all Fields."""
    fields = model._meta.concrete_fields if names is None else [model._meta.get_field(name) for name in names]
    return [field for field in fields if isinstance(field, models.Field)]
