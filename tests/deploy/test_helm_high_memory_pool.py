"""The chart's high-memory worker pool (highMemoryWorkers), rendered by a real helm binary: a
worker Deployment on queues of its own whose container limit is computed above concurrency x the
largest task memory_limit it takes, scaled by KEDA and guarded by a disruption budget like every
workers entry."""
from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.test_helm_chart import KEDA_ON, PRODUCTION, helm_template, of_kind, render, workers

ON = {"highMemoryWorkers.enabled": "true"}


def component(objects: list[dict[str, Any]], kind: str, name: str) -> list[dict[str, Any]]:
    return [o for o in of_kind(objects, kind) if o["metadata"]["labels"]["app.kubernetes.io/component"] == f"worker-{name}"]


def mebibytes(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity.removesuffix("Mi"))


def test_it_is_off_by_default():
    objects = render(sets=KEDA_ON)
    assert [w["metadata"]["name"] for w in workers(objects)] == ["orchestrator-worker-default"]


@pytest.mark.parametrize(("concurrency", "largest", "worker"), [(2, 8192, 512), (3, 2048, 256), (1, 16, 64)])
def test_its_container_limit_is_above_concurrency_times_the_largest_task_limit(concurrency, largest, worker):
    sets = {
        **ON,
        "highMemoryWorkers.concurrency": str(concurrency),
        "highMemoryWorkers.maxTaskMemoryMiB": str(largest),
        "highMemoryWorkers.workerMemoryMiB": str(worker),
    }
    (deployment,) = component(render(sets=sets), "Deployment", "highmem")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    resources = container["resources"]
    limit = mebibytes(resources["limits"]["memory"])
    assert limit == concurrency * largest + worker > concurrency * largest
    assert mebibytes(resources["requests"]["memory"]) == limit  # scheduled only where it fits
    command = container["command"][-1]
    assert f"--concurrency={concurrency} 'highmem'" in command
    assert command.endswith("'highmem'")


def test_it_is_scaled_by_keda_and_guarded_like_the_other_pools():
    objects = render(sets={**KEDA_ON, **ON, "highMemoryWorkers.maxReplicas": "3"})
    (scaled,) = component(objects, "ScaledObject", "highmem")
    (default,) = component(objects, "ScaledObject", "default")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "orchestrator-worker-highmem"
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (0, 3)
    (trigger,) = scaled["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    assert "queue IN ('highmem')" in query
    assert "/ 2::numeric" in query
    # The same scaler as the workers entries', only its own queue and concurrency.
    (other,) = default["spec"]["triggers"]
    assert query == other["metadata"]["query"].replace("'default'", "'highmem'").replace("/ 16::numeric", "/ 2::numeric")
    assert {k: v for k, v in scaled["spec"].items() if k not in ("scaleTargetRef", "triggers", "minReplicaCount", "maxReplicaCount")} == {
        k: v for k, v in default["spec"].items() if k not in ("scaleTargetRef", "triggers", "minReplicaCount", "maxReplicaCount")
    }
    (deployment,) = component(objects, "Deployment", "highmem")
    assert "replicas" not in deployment["spec"]  # KEDA's to set
    assert len(component(objects, "PodDisruptionBudget", "highmem")) == 1


def test_without_keda_it_has_its_replicas_and_where_its_pods_run():
    objects = render(sets={**ON, "highMemoryWorkers.replicas": "2", "highMemoryWorkers.nodeSelector.pool": "memory"})
    (deployment,) = component(objects, "Deployment", "highmem")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "memory"}
    assert of_kind(objects, "ScaledObject") == []


def test_the_production_values_retry_at_8_gib_on_the_big_pool():
    (deployment,) = component(render(PRODUCTION), "Deployment", "highmem")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["memory"] == "16896Mi"  # 2 x 8192 + 512
    assert "--concurrency=2 'highmem'" in container["command"][-1]


@pytest.mark.parametrize(
    ("sets", "shown"),
    [
        ({"highMemoryWorkers.name": "default"}, 'highMemoryWorkers.name "default" is also the name of a workers entry'),
        ({"highMemoryWorkers.queues[0]": "default"}, 'highMemoryWorkers.queues: "default" is also a queue of workers "default"'),
        ({"highMemoryWorkers.maxTaskMemoryMiB": "8"}, "/highMemoryWorkers/maxTaskMemoryMiB"),
        ({"highMemoryWorkers.concurrency": "0"}, "/highMemoryWorkers/concurrency"),
        ({"highMemoryWorkers.queues[0]": "big pool"}, "/highMemoryWorkers/queues/0"),
        ({"highMemoryWorkers.memory": "64Gi"}, "memory"),
    ],
)
def test_what_it_refuses_stops_the_render_naming_the_field(sets, shown):
    result = helm_template(sets={**ON, **sets}, check=False)
    assert result.returncode != 0, result.stderr
    assert shown in result.stderr, result.stderr
