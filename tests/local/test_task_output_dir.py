"""run_local keeps each attempt's whole output in its state directory, unless told otherwise."""
from __future__ import annotations

import io

from orchestrator.local.stack import LocalStack


def test_its_processes_share_an_output_store_in_the_state_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/15")  # no embedded Redis started
    monkeypatch.delenv("ORCHESTRATOR_TASK_OUTPUT_DIR", raising=False)
    stack = LocalStack(state_dir=tmp_path, stream=io.StringIO())
    assert stack._child_env()["ORCHESTRATOR_TASK_OUTPUT_DIR"] == str(tmp_path / "task-output")
    monkeypatch.setenv("ORCHESTRATOR_TASK_OUTPUT_DIR", "none")
    assert stack._child_env()["ORCHESTRATOR_TASK_OUTPUT_DIR"] == "none"
