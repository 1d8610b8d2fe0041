"""python manage.py list_pools: one `NAME SLOTS` line per pool, by name."""
from __future__ import annotations

from django.core.management.base import BaseCommand

from orchestrator.models import Pool


class Command(BaseCommand):
    help = "Print one 'NAME SLOTS' line per pool."

    def handle(self, *args, **options):
        for name, slots in Pool.objects.order_by("name").values_list("name", "slots"):
            self.stdout.write(f"{name} {slots}")
