"""The DAG admin shows each task's retry budget against the deadlines that bound it."""
from __future__ import annotations

import pytest
from django.urls import reverse

from deadlines.models import DeadlineDefinition
from tests.engine.factories import DagFactory, TaskFactory

pytestmark = pytest.mark.django_db


def test_it_shows_the_verdict_with_both_figures_and_the_platform_worst_case(admin_client, settings) -> None:
    settings.ORCHESTRATOR_HEARTBEAT_TIMEOUT = 30
    settings.ORCHESTRATOR_INFRASTRUCTURE_RETRY_DELAY = 10
    dag = DagFactory(default_args={"retries": 3, "execution_timeout": 60, "retry_delay": 30, "retry_max_delay": 120, "infrastructure_retry_limit": 1})
    task = TaskFactory(dag=dag, task_id="load<b>")
    DeadlineDefinition.objects.create(dag=dag, task=task, reference="task_started_at", interval=300, callback="notifier:log")
    page = admin_client.get(reverse("admin:orchestrator_dag_change", args=[dag.pk])).content.decode()
    assert "Retry budgets against deadlines" in page
    assert "<td>load&lt;b&gt;</td><td>task deadlines[0] (task_started_at + 300 s)</td><td>450 s</td><td>300 s</td><td>+100 s</td><td>CAN MISS</td>" in page
