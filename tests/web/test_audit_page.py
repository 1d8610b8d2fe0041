"""The audit log page."""
from __future__ import annotations

import pytest

from orchestrator.operations import actions
from tests.api.factories import chain_dag, fail_until_failed, instance, make_run

pytestmark = pytest.mark.django_db


def test_it_lists_operator_actions_newest_first(alice, bob_client):
    """Who did what to which task, with the prior and new state; notes are escaped."""
    run = make_run(chain_dag("etl", retries=0))
    fail_until_failed(run, "extract")
    actions.mark_success(instance(run, "extract"), alice, note="<i>checked</i>")
    actions.mark_failed(instance(run, "load"), alice)

    html = bob_client.get("/audit/").content.decode()

    assert html.index("mark_failed") < html.index("mark_success")
    assert '<td class="who">alice</td>' in html
    assert 'class="state state-failed">failed</span>' in html
    # the note in a column of its own, escaped
    assert '<td class="wrap note">&lt;i&gt;checked&lt;/i&gt;</td>' in html
    assert "<i>checked</i>" not in html
    assert f'href="/dags/etl/runs/{run.run_id}/"' in html


def test_it_filters_by_user_and_action(alice, bob_client):
    """?action= and ?username= narrow the log."""
    run = make_run(chain_dag("etl", retries=0))
    fail_until_failed(run, "extract")
    actions.mark_success(instance(run, "extract"), alice)
    assert "mark_success" not in bob_client.get("/audit/?action=clear").content.decode().split("<tbody>")[1]
    assert "mark_success" in bob_client.get("/audit/?username=alice").content.decode().split("<tbody>")[1]


def test_a_cli_trigger_names_who_ran_it(bob_client):
    """No Django user: the audit row's who is the OS user, shown "via cli"."""
    import getpass

    from django.core.management import call_command

    chain_dag("etl")
    call_command("trigger_dag", "etl")
    html = bob_client.get("/audit/").content.decode()
    assert f'<td class="who">{getpass.getuser()} <span class="muted">via cli</span></td>' in html
