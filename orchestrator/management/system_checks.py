"""The system checks the engine's long-running processes run as they start.

Every check Django has but the URL checks: those import the URL configuration, and with it the
web API's framework (django-ninja and pydantic), some 14 MiB of memory in each worker, scheduler
and `run_local` process, none of which serves a page. The web server runs them all.
"""
from __future__ import annotations

from django.core.checks import Tags

ENGINE_PROCESS_CHECKS = sorted(
    tag for name, tag in vars(Tags).items() if not name.startswith("_") and isinstance(tag, str) and tag != Tags.urls
)
