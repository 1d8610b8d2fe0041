"""python manage.py run_status: an unknown DAG is named as such, not as a DAG without runs."""
from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from tests.api.factories import chain_dag

pytestmark = pytest.mark.django_db


def test_it_says_unknown_dag_for_a_dag_that_does_not_exist():
    with pytest.raises(CommandError, match="unknown DAG 'no_such_dag'"):
        call_command("run_status", "no_such_dag", "latest")


def test_it_says_a_known_dag_has_no_runs():
    chain_dag("etl")
    with pytest.raises(CommandError, match="DAG 'etl' has no runs"):
        call_command("run_status", "etl", "latest")
