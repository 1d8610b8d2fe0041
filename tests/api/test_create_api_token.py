"""python manage.py create_api_token USERNAME"""
from __future__ import annotations

import subprocess
import sys
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from orchestrator.api.tokens import hash_key
from orchestrator.models import ApiToken
from tests.conftest import ROOT


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.django_db(transaction=True)
def test_it_prints_the_new_token_as_its_only_line(process_env):
    """stdout holds exactly one line: the token, whose SHA-256 is what the database keeps."""
    user = User.objects.create_user("carol")
    result = manage(process_env, "create_api_token", "carol")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    assert len(lines[0]) >= 32
    token = ApiToken.objects.get(user=user)
    assert token.key_hash == hash_key(lines[0])


@pytest.mark.django_db(transaction=True)
def test_it_fails_for_an_unknown_user(process_env):
    """An unknown user is an error on stderr and exit status 1; no token is made."""
    result = manage(process_env, "create_api_token", "nobody")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "unknown user 'nobody'" in result.stderr
    assert not ApiToken.objects.exists()


@pytest.mark.django_db
def test_it_makes_a_different_token_each_time():
    """Each call creates a new token; earlier ones keep working."""
    User.objects.create_user("dave")
    first, second = StringIO(), StringIO()
    call_command("create_api_token", "dave", stdout=first)
    call_command("create_api_token", "dave", stdout=second)
    assert first.getvalue() != second.getvalue()
    assert ApiToken.objects.filter(user__username="dave").count() == 2


@pytest.mark.django_db
def test_it_refuses_an_inactive_user():
    """A token for a deactivated account would not work: refuse to make one."""
    User.objects.create_user("erin", is_active=False)
    with pytest.raises(CommandError, match="inactive"):
        call_command("create_api_token", "erin")
