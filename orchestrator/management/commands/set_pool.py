"""python manage.py set_pool NAME SLOTS [--description TEXT]: create a pool or resize it."""
from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from orchestrator.models import IDENTIFIER, Pool


class Command(BaseCommand):
    help = "Create the pool NAME with SLOTS slots, or set the slots (and description) of an existing one."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("slots", type=int)
        parser.add_argument("--description", default=None, help="What the pool protects (kept if not given).")

    def handle(self, *args, name: str, slots: int, description: str | None, **options):
        try:
            IDENTIFIER(name)
        except ValidationError as exc:
            raise CommandError(f"invalid pool name {name!r}: {' '.join(exc.messages)}") from None
        if slots < 0:
            raise CommandError(f"slots must be a whole number >= 0, not {slots}")
        # Shrinking below what is held is allowed: running tasks finish, nobody new starts
        # until the pool has room again.
        defaults = {"slots": slots, **({"description": description} if description is not None else {})}
        pool, created = Pool.objects.update_or_create(name=name, defaults=defaults)
        self.stdout.write(f"{'created' if created else 'updated'} pool {pool.name}: {pool.slots} slots")
