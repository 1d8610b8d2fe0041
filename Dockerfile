# The image every service of docker-compose.yml runs: web (gunicorn), scheduler, workers, migrate.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONPATH=/app \
    DJANGO_SETTINGS_MODULE=orchestrator.settings

WORKDIR /app
RUN useradd --create-home --uid 1000 orchestrator

COPY . .
RUN pip install . \
    && mkdir -p /app/var/task-output /app/staticfiles \
    && chown orchestrator /app/var /app/var/task-output /app/staticfiles

USER orchestrator
EXPOSE 8000
CMD ["gunicorn", "orchestrator.wsgi", "-b", "0.0.0.0:8000", "--access-logfile", "-"]
