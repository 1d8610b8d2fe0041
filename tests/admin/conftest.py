"""Helpers to post the DAG and task admin forms the way a browser does."""
from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

TASK_ROW = {
    "task_id": "",
    "python_callable": "",
    "bash_command": "",
    "op_kwargs": "{}",
    "upstream": "",
    "trigger_rule": "all_success",
    "retries": "",
    "execution_timeout": "",
    "queue": "",
    "args": "{}",
}
DEADLINE_ROW = {
    "reference": "",
    "interval": "0",
    "datetime_text": "",
    "callback": "",
    "callback_kwargs": "{}",
    "days": "",
    "skip_dates": "",
}


def formset(prefix: str, rows: list[dict[str, Any]], defaults: dict[str, Any], initial: int = 0) -> dict[str, Any]:
    """Management form plus one prefixed entry per row field (unset fields take `defaults`)."""
    data: dict[str, Any] = {
        f"{prefix}-TOTAL_FORMS": str(len(rows)),
        f"{prefix}-INITIAL_FORMS": str(initial),
        f"{prefix}-MIN_NUM_FORMS": "0",
        f"{prefix}-MAX_NUM_FORMS": "1000",
    }
    for index, row in enumerate(rows):
        for key, value in {**defaults, **row}.items():
            if value is False:
                continue  # an unchecked checkbox is not sent
            data[f"{prefix}-{index}-{key}"] = "on" if value is True else value
    return data


def dag_post(
    dag_id: str = "payments", tasks: list[dict] | None = None, deadlines: list[dict] | None = None, **fields: Any
) -> dict[str, Any]:
    """POST data for the DAG add/change page."""
    data: dict[str, Any] = {
        "dag_id": dag_id,
        "description": "",
        "schedule": "",
        "timezone": "UTC",
        "start_date_0": "",
        "start_date_1": "",
        "max_active_runs": "16",
        "default_args": "{}",
        **fields,
    }
    tasks, deadlines = tasks or [], deadlines or []
    # Rows with an "id" are existing objects: they come first, as the admin renders them.
    data.update(formset("tasks", tasks, TASK_ROW, initial=sum(1 for row in tasks if "id" in row)))
    data.update(formset("deadline_definitions", deadlines, DEADLINE_ROW, initial=sum(1 for row in deadlines if "id" in row)))
    return data


def errors_of(response) -> str:
    """Every error the admin shows on a re-rendered form page, as one text."""
    assert response.status_code == 200, f"expected the form again, got {response.status_code}"
    texts = [str(response.context["adminform"].form.errors)]
    for inline in response.context["inline_admin_formsets"]:
        texts.append(str(inline.formset.non_form_errors()))
        texts.extend(str(form.errors) for form in inline.formset.forms)
    text = "\n".join(texts)
    assert text.strip(), "no error shown"
    return text


@pytest.fixture
def admin_client(db) -> Client:
    """A superuser's browser (no password: hashing one is slow and nothing here logs in by form)."""
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", password=None))
    return client


@pytest.fixture
def operator(db) -> Client:
    """A staff user who may edit DAGs but not trigger runs."""
    user = User.objects.create_user("olivia", password=None, is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="orchestrator", codename__in=["view_dag", "change_dag"])
    )
    client = Client()
    client.force_login(user)
    return client
