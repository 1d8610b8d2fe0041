"""python manage.py create_api_token USERNAME: print a new bearer token as the only line of stdout."""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from orchestrator.api.tokens import create_token


class Command(BaseCommand):
    help = "Create an API bearer token for USERNAME and print it (it is not stored and cannot be shown again)."

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username: str, **options):
        user_model = get_user_model()
        user = user_model._default_manager.filter(**{user_model.USERNAME_FIELD: username}).first()
        if user is None:
            raise CommandError(f"unknown user '{username}'")
        if not user.is_active:
            raise CommandError(f"user '{username}' is inactive")
        self.stdout.write(create_token(user))
