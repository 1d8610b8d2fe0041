"""`orchestrator COMMAND ...`: the project's management commands under one name, installed in the
virtualenv's `bin` (like `airflow` or `django-admin`). The same as `python manage.py COMMAND ...`:
same arguments, output and exit codes; only the program's name in help and usage text differs."""
from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(["orchestrator", *sys.argv[1:]])


if __name__ == "__main__":
    main()
