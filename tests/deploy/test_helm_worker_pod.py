"""The chart's worker container, run as Kubernetes runs it: its rendered command as PID 1 of a
PID namespace of its own (`unshare`), its probes, its preStop hook run inside that namespace
(`nsenter`), and a restart in the same "pod" after the worker was SIGKILLed. Without a task user:
this machine has no orchestrator-task (tests/deploy/test_helm_chart.py checks that setting)."""
from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.foundation.redis_conn import get_redis
from tests.conftest import ROOT, wait_until
from tests.deploy.test_helm_chart import env_of, of_kind, render
from tests.deploy.test_helm_web_pod import free_port


@pytest.fixture(scope="module")
def container(tmp_path_factory) -> dict[str, Any]:
    values = tmp_path_factory.mktemp("values") / "values.yaml"
    values.write_text(
        "workers:\n  - {name: default, queues: [pod-test], concurrency: 2, replicas: 1, resources: {requests: {cpu: 100m}}}\n"
        f"workerPod: {{taskUser: '', healthPort: {free_port()}}}\n"
    )
    objects = render(values)
    (deployment,) = [o for o in of_kind(objects, "Deployment") if o["metadata"]["name"].endswith("-worker-default")]
    (worker,) = deployment["spec"]["template"]["spec"]["containers"]
    return worker


@pytest.fixture
def pod(process_env, container):
    """start() runs the container's command as PID 1 of a new PID namespace; returns the
    `unshare` process (its child, the worker, dies with it)."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        pytest.skip("needs root and util-linux's unshare and nsenter")
    env = {
        **process_env,
        "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
        "ORCHESTRATOR_HEARTBEAT_INTERVAL": "0.5",
        "ORCHESTRATOR_WORKER_HEALTH_PORT": env_of(container)["ORCHESTRATOR_WORKER_HEALTH_PORT"]["value"],
    }
    started: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--kill-child", *container["command"]],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def probe(container: dict[str, Any], name: str) -> int:
    """The status the kubelet's httpGet of that probe gets (the pod's IP is this machine's)."""
    get = container[name]["httpGet"]
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == get["port"]]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", get["path"])
        return connection.getresponse().status
    finally:
        connection.close()


def pid_one_of(unshare: subprocess.Popen) -> int:
    """The worker: the child of `unshare`, PID 1 inside its namespace."""
    def child() -> int | None:
        try:
            children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read_text().split()
        except FileNotFoundError:
            return None
        return int(children[0]) if children else None

    return wait_until(child, timeout=10, message="the worker process")


def records() -> dict[str, dict[bytes, bytes]]:
    client = get_redis()
    return {key.decode(): client.hgetall(key) for key in client.scan_iter("rq:worker:*") if client.type(key) == b"hash"}


def pid_one_records() -> list[str]:
    return [key for key, record in records().items() if record.get(b"pid") == b"1"]


@pytest.mark.timeout(300)
def test_the_worker_container_runs_as_pid_1_restarts_in_place_and_drains_on_prestop(pod, container):
    first = pod()
    wait_until(lambda: pid_one_records(), timeout=120, interval=0.5, message="the worker to register")
    assert probe(container, "startupProbe") == 200
    assert probe(container, "livenessProbe") == 200
    assert probe(container, "readinessProbe") == 200
    (name,) = [key for key, record in records().items() if record.get(b"pid") == b"1"]
    assert name.startswith(f"rq:worker:{socket.gethostname()}.")

    # The worker dies hard; the container restarts in the same pod: same host name, PID 1 again.
    first.send_signal(signal.SIGKILL)  # --kill-child: the worker gets SIGKILL with it
    first.wait(timeout=10)
    time.sleep(1.1)  # a restart is never within the same second (the kubelet backs off 10 s)
    second = pod()
    wait_until(lambda: len(pid_one_records()) == 2, timeout=120, interval=0.5,
               message="the restarted worker to register beside the dead one's record")
    wait_until(lambda: probe(container, "livenessProbe") == 200, timeout=30, interval=0.5, message="the restarted worker's probe")
    assert second.poll() is None

    # preStop, run inside the pod's PID namespace: SIGUSR1 to PID 1 drains the idle worker.
    worker = pid_one_of(second)
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    subprocess.run(["nsenter", "--target", str(worker), "--pid", *command], check=True, timeout=30)
    assert second.wait(timeout=60) == 0
