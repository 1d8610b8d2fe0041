"""GET /api/v1/alerts, the Alerts page, a task page's incidents, the metric, and the DAG owner
in the API, the DAG list, the failures page and GET /api/v1/failures."""
from __future__ import annotations

import pytest

from alerts import sending
from orchestrator.models import Dag
from tests.alerts.helpers import fail, rule, run_of, succeed

pytestmark = pytest.mark.django_db(transaction=True)

SECRET_URL = "https://hooks.example/T0/B0/xyzSECRET?token=abc"


@pytest.fixture(autouse=True)
def allowed(settings) -> None:
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["hooks.example"]


def incidents_made():
    """One resolved incident (rule "older") and one open (rule "newer") with an escaped sample."""
    older = rule("older", resolve=True, dag_id=["a"])
    run = run_of("a")
    fail(run)
    succeed(run)
    from alerts.incidents import absorb, resolve_over
    from orchestrator.foundation.clock import shared_now

    absorb()  # the sender's count of the queued event
    resolve_over(shared_now())
    rule("newer", notify="notifier:webhook", notify_kwargs={"url": SECRET_URL}, dag_id=["<b>*"])
    evil = run_of("<b>bold", tasks=("t",))
    fail(evil, error="<script>alert(1)</script>")
    absorb()
    return older


def test_the_api_lists_incidents_open_first_with_their_deliveries(alice_client):
    incidents_made()
    body = alice_client.get("/api/v1/alerts").json()
    assert body["count"] == 2
    first, second = body["incidents"]
    assert (first["rule"], first["state"], second["rule"], second["state"]) == ("newer", "open", "older", "resolved")
    assert set(first) == {"id", "rule", "group", "state", "count", "first_event_at", "last_event_at", "resolved_at", "sample", "deliveries"}
    assert first["deliveries"] == [{"event": "opened", "at": first["first_event_at"], "outcome": "pending", "tries": 0}]
    assert [d["event"] for d in second["deliveries"]] == ["opened", "resolved"]
    assert second["resolved_at"]
    assert [i["rule"] for i in alice_client.get("/api/v1/alerts?state=resolved").json()["incidents"]] == ["older"]
    assert [i["rule"] for i in alice_client.get("/api/v1/alerts?rule=newer").json()["incidents"]] == ["newer"]
    assert alice_client.get("/api/v1/alerts?state=maybe").status_code == 400
    assert "xyzSECRET" not in alice_client.get("/api/v1/alerts").content.decode()


def test_the_api_needs_a_login(anonymous_client):
    assert anonymous_client.get("/api/v1/alerts").status_code == 401


def test_the_alerts_page_escapes_everything_and_masks_secrets(alice_client, bob_client):
    incidents_made()
    page = bob_client.get("/alerts/").content.decode()
    assert "<script>alert(1)" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>bold" not in page
    assert "&lt;b&gt;bold" in page
    assert "xyzSECRET" not in page
    assert "token=abc" not in page
    assert "https://hooks.example/****" in page
    assert page.index("newer") < page.index("older")
    assert 'href="/alerts/"' in page  # in the nav
    assert bob_client.get("/alerts/?state=maybe").status_code == 400


def test_a_task_page_lists_the_incidents_it_fed(alice_client):
    older = incidents_made()
    run = older.incidents.get().feeds.get()
    from orchestrator.models import DagRun

    dag_run = DagRun.objects.get(pk=run.dag_run_id)
    page = alice_client.get(f"/dags/a/runs/{dag_run.run_id}/tasks/t").content.decode()
    assert 'id="task-incidents"' in page
    assert "older" in page
    assert "newer" not in page


def test_the_metric_counts_every_try(alice_client, settings):
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["hooks.example"]
    incidents_made()
    sending.send_due()  # hooks.example does not resolve here: a failed try
    text = alice_client.get("/metrics").content.decode()
    line = next(line for line in text.splitlines() if line.startswith("orchestrator_alert_notifications_total{") and 'rule="newer"' in line)
    assert 'outcome="failed"' in line
    assert float(line.rsplit(" ", 1)[1]) >= 1
    assert 'outcome="sent"' in text  # the log notifier of "older"


def test_the_owner_is_in_the_api_and_filters_the_dag_list_and_the_failures(alice_client):
    mine, theirs = run_of("mine", owner="data-team"), run_of("theirs", owner="web-team")
    run_of("nobodys")
    fail(mine)
    fail(theirs)
    dags = {d["dag_id"]: d["owner"] for d in alice_client.get("/api/v1/dags").json()["dags"]}
    assert dags == {"mine": "data-team", "theirs": "web-team", "nobodys": None}
    assert alice_client.get("/api/v1/dags/mine").json()["owner"] == "data-team"
    failures = alice_client.get("/api/v1/failures?owner=data-team").json()
    assert failures["count"] == 1
    assert failures["failures"][0]["dag_id"] == "mine"
    page = alice_client.get("/?owner=web-team").content.decode()
    assert "/dags/theirs/" in page
    assert "/dags/mine/" not in page
    assert "/dags/nobodys/" not in page
    failures_page = alice_client.get("/failures/?owner=data-team&window=1h").content.decode()
    assert "mine / t" in failures_page
    assert "theirs / t" not in failures_page


def test_the_owner_is_exported_and_imported(tmp_path):
    import io

    import yaml
    from django.core.management import CommandError, call_command

    spec = {"dag_id": "owned", "owner": "data-team", "schedule": None, "tasks": [{"task_id": "t", "bash_command": "true"}]}
    path = tmp_path / "dag.yaml"
    path.write_text(yaml.safe_dump(spec))
    call_command("import_dags", str(path), stdout=io.StringIO())
    assert Dag.objects.get(dag_id="owned").owner == "data-team"
    out = io.StringIO()
    call_command("export_dags", "owned", stdout=out)
    exported = yaml.safe_load(out.getvalue())
    assert (exported[0] if isinstance(exported, list) else exported)["owner"] == "data-team"
    path.write_text(yaml.safe_dump({**spec, "owner": "data team"}))
    with pytest.raises(CommandError, match="dag 'owned': owner: must be"):
        call_command("import_dags", str(path), stdout=io.StringIO())
