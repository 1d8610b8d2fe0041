"""WSGI entry point (gunicorn orchestrator.wsgi)."""
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")


def _keep_connections() -> None:
    """A WSGI server's process keeps its database connection from one request to the next (checked
    before it is used again) instead of opening one per request, which cost an API request a
    quarter of its time on PostgreSQL, more on a busy machine. Only here: the scheduler and workers
    close theirs on purpose. A `conn_max_age` in DATABASE_URL still decides."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if "CONN_MAX_AGE" not in database:
        database["CONN_MAX_AGE"] = 60
        database.setdefault("CONN_HEALTH_CHECKS", True)


_keep_connections()  # before the first connection is made: a connection reads these when it opens
application = get_wsgi_application()
