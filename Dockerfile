# The image every service of docker-compose.yml runs: web (gunicorn), scheduler, workers, migrate.
# Its user is orchestrator; the workers run as root to run their tasks as orchestrator-task
# (docker-compose.yml, the Helm chart).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONPATH=/app \
    DJANGO_SETTINGS_MODULE=orchestrator.settings

WORKDIR /app
# The platform's processes run as orchestrator (uid 1000). Tasks run as orchestrator-task
# (ORCHESTRATOR_TASK_USER: the worker, as root, switches each task process to it): a group of its
# own and no other, no home (each attempt gets a private directory as HOME), no login shell.
# Python and its packages live under /usr/local and the project under /app, readable by both.
RUN useradd --create-home --uid 1000 orchestrator \
    && groupadd --gid 10001 orchestrator-task \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin orchestrator-task

COPY . .
RUN pip install . \
    && mkdir -p /app/var/task-output /app/staticfiles \
    && chown orchestrator /app/var /app/var/task-output /app/staticfiles

USER orchestrator
EXPOSE 8000
CMD ["gunicorn", "orchestrator.wsgi", "-b", "0.0.0.0:8000", "--access-logfile", "-"]
