"""The Helm chart (deploy/helm/orchestrator), rendered by a real helm binary and checked as objects.

Every rendered object is validated against the Kubernetes schemas of a pinned version (strict:
an unknown field is an error) and the KEDA objects against KEDA's own CRD schemas (vendored in
deploy/helm/schemas). Then the invariants: no credential in clear, probes, resources and a
non-root user for every container, a worker grace that covers the shutdown grace and the kill
grace, migrations before any pod, KEDA objects only when asked for.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.conftest import ROOT
from tests.deploy.test_compose import RECORD_READS

CHART = ROOT / "deploy" / "helm" / "orchestrator"
PRODUCTION = CHART / "values-production.yaml"
KEDA_SCHEMAS = ROOT / "deploy" / "helm" / "schemas" / "keda-v2.20.2"
KUBERNETES_VERSION = "1.33.0"
CREDENTIALS = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")
KEDA_ON = {"keda.enabled": "true"}
HOOKS_OFF = {"migrations.useHelmHooks": "false"}


def helm_binary() -> str:
    """The helm the Makefile installs into .venv (deploy/helm/install_helm.py), else one on PATH."""
    local = ROOT / ".venv" / "bin" / "helm"
    found = str(local) if local.exists() else shutil.which("helm")
    if found is None:
        pytest.fail("no helm binary: `make test` installs one (python deploy/helm/install_helm.py .venv/bin/helm)")
    return found


def helm_template(*values_files: Path, sets: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    command = [helm_binary(), "template", "orchestrator", str(CHART), "--namespace", "data"]
    for path in values_files:
        command += ["-f", str(path)]
    for key, value in (sets or {}).items():
        command += ["--set", f"{key}={value}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def render(*values_files: Path, sets: dict[str, str] | None = None) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(helm_template(*values_files, sets=sets).stdout) if doc]


# Every combination the tests look at, rendered once.
VARIANTS = {
    "default": ((), {}),
    "production": ((PRODUCTION,), {}),
    "keda": ((), KEDA_ON),
    "hooks-off": ((), HOOKS_OFF),
    "inline-dags": ((), {"dags.files.etl\\.yaml": "dag_id: etl"}),
    "output-volume": ((), {"outputVolume.claimName": "task-output-claim"}),
    "no-task-user": ((), {"workerPod.taskUser": ""}),
    "high-memory-pool": ((), {**KEDA_ON, "highMemoryWorkers.enabled": "true"}),
}
# What a worker needs to run its tasks as the task user, and nothing more (see the chart's
# orchestrator.workerSecurityContext).
TASK_USER_CAPABILITIES = ["SETUID", "SETGID", "KILL", "CHOWN", "FOWNER", "DAC_OVERRIDE"]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: render(*files, sets=sets) for name, (files, sets) in VARIANTS.items()}


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def pod_specs(objects: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(o, o["spec"]["template"]["spec"]) for o in objects if o["kind"] in ("Deployment", "Job")]


def workers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in of_kind(objects, "Deployment") if o["metadata"]["labels"]["app.kubernetes.io/component"].startswith("worker-")]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item for item in container.get("env", [])}


def keda_schema(name: str) -> dict[str, Any]:
    return json.loads((KEDA_SCHEMAS / f"{name}.json").read_text())


# --- schemas -------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_object_is_valid_for_the_pinned_kubernetes_version(rendered, variant):
    objects = rendered[variant]
    assert objects
    for obj in objects:
        if obj["apiVersion"].startswith("keda.sh/"):
            continue
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("variant", ["keda", "production"])
def test_keda_objects_are_valid_for_keda_crds(rendered, variant):
    keda = [o for o in rendered[variant] if o["apiVersion"].startswith("keda.sh/")]
    assert {o["kind"] for o in keda} == {"ScaledObject", "TriggerAuthentication"}
    for obj in keda:
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        schema = keda_schema({"ScaledObject": "scaledobjects", "TriggerAuthentication": "triggerauthentications"}[obj["kind"]])
        jsonschema.validate(obj, schema)


def test_the_validators_are_not_vacuous(rendered):
    """A misspelt field fails the Kubernetes check, and a ScaledObject without a target the KEDA one."""
    deployment = json.loads(json.dumps(of_kind(rendered["default"], "Deployment")[0]))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    scaled = json.loads(json.dumps(of_kind(rendered["keda"], "ScaledObject")[0]))
    del scaled["spec"]["scaleTargetRef"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, keda_schema("scaledobjects"))


@pytest.mark.parametrize("values_files", [(), (PRODUCTION,)], ids=["default", "production"])
def test_helm_lint_passes_strictly(values_files):
    command = [helm_binary(), "lint", "--strict", str(CHART)]
    for path in values_files:
        command += ["-f", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_values_the_schema_refuses_stop_the_render_naming_the_field():
    cases = {
        "workers[0].queues[0]": ("bad queue; DROP TABLE x", "/workers/0/queues/0"),
        "secret.password": ("hunter2", "password"),
        "extraEnv[0].name": ("SECRET_KEY", "/extraEnv/0/name"),
        "config.NOT_A_SETTING": ("1", "NOT_A_SETTING"),
        "workers[0].concurrency": ("0", "/workers/0/concurrency"),
        "workerPod.taskUser": ("root", "/workerPod/taskUser"),
        "workerPod.healthPort": ("0", "/workerPod/healthPort"),
    }
    for key, (value, named) in cases.items():
        result = helm_template(sets={key: value}, check=False)
        assert result.returncode != 0, key
        assert named in result.stderr, (key, result.stderr)


# --- secrets -------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_no_credential_is_in_clear(rendered, variant):
    objects = rendered[variant]
    assert not of_kind(objects, "Secret")
    for owner, spec in pod_specs(objects):
        for container in spec.get("initContainers", []) + spec["containers"]:
            env = env_of(container)
            for name in CREDENTIALS:
                if container["name"] == "static-proxy":
                    assert name not in env
                    continue
                assert "value" not in env[name], (owner["metadata"]["name"], container["name"], name)
                assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "orchestrator"
    text = yaml.safe_dump_all(objects)
    assert not re.search(r"(postgres|postgresql|redis|rediss)://", text)


def test_keda_reads_the_database_from_the_existing_secret(rendered):
    (auth,) = of_kind(rendered["keda"], "TriggerAuthentication")
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "connection", "name": "orchestrator", "key": "DATABASE_URL"}]
    for scaled in of_kind(rendered["keda"], "ScaledObject"):
        (trigger,) = scaled["spec"]["triggers"]
        assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
        assert not set(trigger["metadata"]) & {"connection", "connectionFromEnv", "password", "host"}


# --- every container -----------------------------------------------------------------------------


def runs_tasks_as_another_user(container: dict[str, Any]) -> bool:
    return "ORCHESTRATOR_TASK_USER" in env_of(container)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_container_has_probes_resources_and_a_non_root_user(rendered, variant):
    """Every container but a worker with a task user (root with a few capabilities: the test
    below) runs as a non-root user, with no capability."""
    for owner, spec in pod_specs(rendered[variant]):
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        assert spec["automountServiceAccountToken"] is False
        for container in spec.get("initContainers", []) + spec["containers"]:
            where = (owner["metadata"]["name"], container["name"])
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, where
            assert security["allowPrivilegeEscalation"] is False, where
            assert security["capabilities"]["drop"] == ["ALL"], where
            if runs_tasks_as_another_user(container):
                continue
            assert security["runAsNonRoot"] is True, where
            assert security["runAsUser"] != 0, where
            # Only the proxy adds one back: the one its image's binary needs to be executed at all.
            assert security["capabilities"].get("add", []) == (["NET_BIND_SERVICE"] if container["name"] == "static-proxy" else []), where
            assert container["resources"]["requests"]["cpu"], where
            assert container["resources"]["requests"]["memory"], where
            assert container["resources"]["limits"]["memory"], where
        if owner["kind"] == "Deployment":
            for container in spec["containers"]:
                assert container.get("livenessProbe"), (owner["metadata"]["name"], container["name"])
                assert container.get("readinessProbe"), (owner["metadata"]["name"], container["name"])


def test_the_probes_check_what_each_process_records(rendered):
    deployments = {o["metadata"]["labels"]["app.kubernetes.io/component"]: o for o in of_kind(rendered["production"], "Deployment")}
    web = {c["name"]: c for c in deployments["web"]["spec"]["template"]["spec"]["containers"]}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = web["web"][probe]["httpGet"]
        assert get["path"] == "/healthz"
        assert {"name": "Host", "value": "localhost"} in get["httpHeaders"]
    assert "localhost" in env_of(web["web"])["ALLOWED_HOSTS"]["value"].split(",")
    (scheduler,) = deployments["scheduler"]["spec"]["template"]["spec"]["containers"]
    live = scheduler["livenessProbe"]["exec"]["command"]
    ready = scheduler["readinessProbe"]["exec"]["command"]
    assert live[:4] == ["python", "manage.py", "check_alive", "scheduler"]
    assert "--ready" not in live
    assert ready[:4] == ["python", "manage.py", "check_alive", "scheduler"]
    assert "--ready" in ready
    assert scheduler["startupProbe"]["exec"]["command"][:4] == live[:4]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_worker_probes_start_no_process_in_the_container(rendered, variant):
    """A probe process in a worker container would hold its whole environment (the database's
    password, SECRET_KEY) where a task could read it: the kubelet GETs the worker's own health
    endpoint instead, on the port the worker is told, and the probes carry no environment."""
    for deployment in workers(rendered[variant]):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        port = int(env_of(container)["ORCHESTRATOR_WORKER_HEALTH_PORT"]["value"])
        assert {"name": "health", "containerPort": port} in container["ports"]
        paths = {}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            handlers = set(container[probe]) & {"exec", "httpGet", "tcpSocket", "grpc"}
            assert handlers == {"httpGet"}, (deployment["metadata"]["name"], probe)
            get = container[probe]["httpGet"]
            assert get["port"] == "health"
            assert set(get) == {"path", "port"}
            paths[probe] = get["path"]
        assert paths == {"startupProbe": "/livez", "livenessProbe": "/livez", "readinessProbe": "/readyz"}
        assert not re.search(r"(postgres|redis)://|SECRET_KEY|DATABASE_URL", json.dumps([container[p] for p in paths]))


@pytest.mark.parametrize("variant", ["default", "production", "keda"])
def test_a_worker_runs_its_tasks_as_the_task_user_with_only_the_capabilities_that_takes(rendered, variant):
    dockerfile = (ROOT / "Dockerfile").read_text()
    for deployment in workers(rendered[variant]):
        spec = deployment["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        where = deployment["metadata"]["name"]
        task_user = env_of(container)["ORCHESTRATOR_TASK_USER"]["value"]
        assert re.search(rf"useradd [^\n]*--uid (\d+) [^\n]*{task_user}$", dockerfile, re.M), task_user  # the image has it
        security = container["securityContext"]
        # Root, for switching users takes root; its group stays the pod's (the image's).
        assert security["runAsUser"] == 0, where
        assert security["runAsNonRoot"] is False, where
        assert "runAsGroup" not in security
        assert spec["securityContext"]["runAsGroup"] == 1000
        assert security["capabilities"] == {"drop": ["ALL"], "add": TASK_USER_CAPABILITIES}, where
        assert security["allowPrivilegeEscalation"] is False, where
        assert security["readOnlyRootFilesystem"] is True, where
        assert set(security) == {"runAsUser", "runAsNonRoot", "capabilities", "allowPrivilegeEscalation", "readOnlyRootFilesystem"}
        # Its emptyDirs (world-writable, no sticky bit) made safe before any task runs.
        assert container["command"][2].startswith("chmod 1777 /tmp && chmod 0755 /app/var && exec python manage.py run_worker ")
        # The init container still runs as the image's user.
        for init in spec.get("initContainers", []):
            assert init["securityContext"]["runAsUser"] == 1000
            assert "add" not in init["securityContext"]["capabilities"]
    for deployment in of_kind(rendered[variant], "Deployment"):
        if deployment not in workers(rendered[variant]):
            for container in deployment["spec"]["template"]["spec"]["containers"]:
                assert "ORCHESTRATOR_TASK_USER" not in env_of(container)
                assert container["securityContext"]["runAsUser"] != 0


def test_without_a_task_user_the_worker_stays_the_images_user(rendered):
    """Tasks would then run as the worker: it must not be root, nor hold any capability."""
    for deployment in workers(rendered["no-task-user"]):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert "ORCHESTRATOR_TASK_USER" not in env_of(container)
        security = container["securityContext"]
        assert security["runAsUser"] == 1000
        assert security["runAsNonRoot"] is True
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert container["command"][2].startswith("exec python manage.py run_worker ")


def test_every_orchestrator_setting_comes_from_values():
    """Each ORCHESTRATOR_* variable the settings read is a documented key of values.yaml's config."""
    env = {**os.environ, "DATABASE_URL": "postgres://u@127.0.0.1:5432/d", "REDIS_URL": "redis://127.0.0.1:6379/0", "SECRET_KEY": "x" * 50}
    result = subprocess.run([sys.executable, "-c", RECORD_READS], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    read = {name for name in json.loads(result.stdout) if name.startswith("ORCHESTRATOR_")}
    config = yaml.safe_load((CHART / "values.yaml").read_text())["config"]
    # The spool's place and the workers' own two (workerPod) are set by the chart itself.
    own = {"ORCHESTRATOR_SPOOL_DIR", "ORCHESTRATOR_TASK_USER", "ORCHESTRATOR_WORKER_HEALTH_PORT"}
    assert read - own <= set(config), sorted(read - own - set(config))
    text = (CHART / "values.yaml").read_text()
    for name in config:  # documented: a comment stands before the key or the group it belongs to
        assert re.search(rf"#[^\n]*\n(\s+ORCHESTRATOR_\w+: [^\n]*\n)*\s+{name}:", text), name


@pytest.mark.parametrize("variant", ["default", "production"])
def test_every_process_gets_the_settings_and_https_on(rendered, variant):
    config = yaml.safe_load((CHART / "values.yaml").read_text())["config"]
    for owner, spec in pod_specs(rendered[variant]):
        for container in spec.get("initContainers", []) + spec["containers"]:
            if container["name"] == "static-proxy":
                continue
            env = env_of(container)
            assert set(config) <= set(env), (owner["metadata"]["name"], container["name"])
            assert env["SECURE_SSL_REDIRECT"]["value"] == "true"
            assert env["DEBUG"]["value"] == "false"
            assert env["ORCHESTRATOR_SPOOL_DIR"]["value"].startswith("/app/var/")


def test_the_output_volume_is_mounted_where_output_is_written_served_and_deleted(rendered):
    """outputVolume.claimName: workers and the scheduler (its clean-up deletes files) mount the
    claim read-write, the web container read-only, and all of them are told where; without it,
    no pod mounts it and the output store is off."""
    mounted = {}
    for owner, spec in pod_specs(rendered["output-volume"]):
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v}
        for container in spec["containers"]:
            mount = next((m for m in container.get("volumeMounts", []) if m["name"] == "task-output"), None)
            if mount is None:
                continue
            assert claims["task-output"] == "task-output-claim"
            assert env_of(container)["ORCHESTRATOR_TASK_OUTPUT_DIR"]["value"] == mount["mountPath"]
            mounted[owner["metadata"]["labels"]["app.kubernetes.io/component"].split("-")[0]] = mount.get("readOnly", False)
    assert mounted == {"web": True, "worker": False, "scheduler": False}
    for _, spec in pod_specs(rendered["default"]):
        assert not any("persistentVolumeClaim" in v for v in spec["volumes"])
        for container in spec["containers"]:
            assert env_of(container).get("ORCHESTRATOR_TASK_OUTPUT_DIR", {"value": ""})["value"] == ""


def test_django_deploy_check_passes_with_the_web_container_environment(rendered):
    """`manage.py check --deploy` with exactly what the production web container gets (the
    Secret's keys filled with test values)."""
    (web,) = [o for o in of_kind(rendered["production"], "Deployment") if o["metadata"]["name"].endswith("-web")]
    (container,) = [c for c in web["spec"]["template"]["spec"]["containers"] if c["name"] == "web"]
    secret = {"DATABASE_URL": os.environ["DATABASE_URL"], "REDIS_URL": os.environ["REDIS_URL"], "SECRET_KEY": secrets.token_urlsafe(50)}
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "secretKeyRef" in item["valueFrom"] and item["name"] in secret:
            env[item["name"]] = secret[item["name"]]
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert env["CSRF_TRUSTED_ORIGINS"] == "https://orchestrator.example.com"
    assert "orchestrator.example.com" in env["ALLOWED_HOSTS"].split(",")


def test_the_web_service_and_ingress_reach_the_proxy_in_the_web_pod(rendered):
    objects = rendered["production"]
    (service,) = of_kind(objects, "Service")
    (ingress,) = of_kind(objects, "Ingress")
    (web,) = [o for o in of_kind(objects, "Deployment") if o is not None and o["metadata"]["name"] == service["metadata"]["name"]]
    assert service["spec"]["selector"].items() <= web["spec"]["template"]["metadata"]["labels"].items()
    proxy = [c for c in web["spec"]["template"]["spec"]["containers"] if c["name"] == "static-proxy"][0]
    assert service["spec"]["ports"][0]["targetPort"] == proxy["ports"][0]["name"]
    assert ingress["spec"]["tls"] == [{"secretName": "orchestrator-tls", "hosts": ["orchestrator.example.com"]}]
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] == service["metadata"]["name"]
    assert not of_kind(rendered["default"], "Ingress")


def test_the_proxy_config_is_valid_caddyfile(rendered):
    caddy = shutil.which("caddy")
    if caddy is None:
        pytest.skip("caddy is not installed (Debian's caddy package)")
    (config,) = [o for o in of_kind(rendered["default"], "ConfigMap") if o["metadata"]["name"].endswith("-web-proxy")]
    result = subprocess.run(
        [caddy, "validate", "--adapter", "caddyfile", "--config", "/dev/stdin"],
        input=config["data"]["Caddyfile"], capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr


# --- workers: shutdown and scaling ---------------------------------------------------------------


@pytest.mark.parametrize("variant", ["default", "production", "keda", "high-memory-pool"])
def test_a_worker_pod_outlives_its_shutdown_grace_and_kill_grace(rendered, variant):
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    if variant == "production":
        values.update(yaml.safe_load(PRODUCTION.read_text()))
    deployments = workers(rendered[variant])
    high_memory = variant in ("production", "high-memory-pool")  # its pool is enabled there
    assert len(deployments) == len(values["workers"]) + high_memory
    for deployment in deployments:
        spec = deployment["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        env = env_of(container)
        shutdown_grace = float(env["ORCHESTRATOR_WORKER_SHUTDOWN_GRACE"]["value"])
        kill_grace = max(float(env["ORCHESTRATOR_KILL_GRACE"]["value"]), values["shutdown"]["maxTaskKillGrace"])
        assert spec["terminationGracePeriodSeconds"] >= shutdown_grace + kill_grace + values["shutdown"]["margin"]
        # The preStop only drains (SIGUSR1): the kubelet's SIGTERM stays the first termination
        # signal, so it starts the grace instead of ending it.
        assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sh", "-c", "kill -USR1 1"]
        shell, option, script = container["command"]
        assert (shell, option) == ("sh", "-c")
        assert re.match(r"(chmod [^&]+ && )*exec python manage.py run_worker ", script)


def test_a_worker_entry_may_have_its_own_shutdown_grace(rendered):
    (gpu,) = [d for d in workers(rendered["production"]) if d["metadata"]["name"].endswith("-worker-gpu")]
    spec = gpu["spec"]["template"]["spec"]
    assert env_of(spec["containers"][0])["ORCHESTRATOR_WORKER_SHUTDOWN_GRACE"]["value"] == "600"
    assert spec["terminationGracePeriodSeconds"] == 600 + 30 + 15
    assert spec["containers"][0]["command"][-1].endswith(" --concurrency=1 'gpu'")


def test_keda_objects_exist_only_when_enabled(rendered):
    for variant in ("default", "hooks-off"):
        assert not [o for o in rendered[variant] if o["apiVersion"].startswith("keda.sh/")]
        assert all("replicas" in d["spec"] for d in workers(rendered[variant]))
    for variant in ("keda", "production"):
        scaled = {o["spec"]["scaleTargetRef"]["name"]: o for o in of_kind(rendered[variant], "ScaledObject")}
        deployments = workers(rendered[variant])
        assert set(scaled) == {d["metadata"]["name"] for d in deployments}
        for deployment in deployments:
            assert "replicas" not in deployment["spec"]  # the HPA owns it
            spec = scaled[deployment["metadata"]["name"]]["spec"]
            grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            assert spec["cooldownPeriod"] > grace
            assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] > grace
            (trigger,) = spec["triggers"]
            assert trigger["type"] == "postgresql"
            assert trigger["metadata"]["targetQueryValue"] == "1"


def test_a_cool_down_shorter_than_the_grace_is_refused():
    result = helm_template(sets={**KEDA_ON, "keda.cooldownPeriod": "30"}, check=False)
    assert result.returncode != 0
    assert "keda.cooldownPeriod (30) must be longer than the termination grace" in result.stderr


def test_each_worker_deployment_has_a_disruption_budget(rendered):
    objects = rendered["production"]
    budgets = {o["metadata"]["name"]: o for o in of_kind(objects, "PodDisruptionBudget")}
    for deployment in of_kind(objects, "Deployment"):
        budget = budgets[deployment["metadata"]["name"]]
        assert budget["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert budgets["orchestrator-web"]["spec"]["minAvailable"] == 2
    assert budgets["orchestrator-scheduler"]["spec"]["maxUnavailable"] == 1


def test_two_schedulers_by_default(rendered):
    (scheduler,) = [d for d in of_kind(rendered["default"], "Deployment") if d["metadata"]["name"].endswith("-scheduler")]
    assert scheduler["spec"]["replicas"] == 2


# --- migrations and DAGs -------------------------------------------------------------------------


def test_migrations_run_in_a_hook_before_the_deployments(rendered):
    objects = rendered["default"]
    (job,) = of_kind(objects, "Job")
    annotations = job["metadata"]["annotations"]
    assert set(annotations["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert "migrate --noinput" in job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    for deployment in of_kind(objects, "Deployment"):
        assert "helm.sh/hook" not in deployment["metadata"].get("annotations", {})
        assert deployment["spec"]["template"]["spec"]["initContainers"][0]["name"] == "wait-for-migrations"


def test_without_hooks_the_job_is_plain_and_the_pods_wait_for_it(rendered):
    objects = rendered["hooks-off"]
    (job,) = of_kind(objects, "Job")
    assert "helm.sh/hook" not in job["metadata"].get("annotations", {})
    for deployment in of_kind(objects, "Deployment"):
        (wait, *_) = deployment["spec"]["template"]["spec"]["initContainers"]
        assert wait["name"] == "wait-for-migrations"
        assert "migrate --check" in wait["command"][-1]
    # A new image makes a Job of a new name (a Job's pod template cannot be changed in place).
    other = render(sets={**HOOKS_OFF, "image.tag": "2.0.0"})
    assert of_kind(other, "Job")[0]["metadata"]["name"] != job["metadata"]["name"]


def test_dags_are_imported_from_a_configmap_or_a_path_in_the_image(rendered):
    (job,) = of_kind(rendered["inline-dags"], "Job")
    (dags,) = [o for o in of_kind(rendered["inline-dags"], "ConfigMap") if o["metadata"]["name"].endswith("-dags")]
    assert dags["data"] == {"etl.yaml": "dag_id: etl"}
    assert dags["metadata"]["annotations"]["helm.sh/hook-weight"] == "-1"  # before the Job that reads it
    spec = job["spec"]["template"]["spec"]
    assert {"name": "dags", "configMap": {"name": dags["metadata"]["name"]}} in spec["volumes"]
    assert "import_dags '/dags'" in spec["containers"][0]["command"][-1]
    (production_job,) = of_kind(rendered["production"], "Job")
    assert "import_dags --strict '/app/dags'" in production_job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    (default_job,) = of_kind(rendered["default"], "Job")
    assert "import_dags" not in default_job["spec"]["template"]["spec"]["containers"][0]["command"][-1]


# --- the image -----------------------------------------------------------------------------------


def test_the_pods_run_as_the_dockerfiles_user_and_write_only_where_it_lets_them(rendered):
    dockerfile = (ROOT / "Dockerfile").read_text()
    uid = int(re.search(r"useradd [^\n]*--uid (\d+)", dockerfile).group(1))
    assert re.search(r"^WORKDIR /app$", dockerfile, re.M)
    for owner, spec in pod_specs(rendered["production"]):
        assert spec["securityContext"]["runAsUser"] == uid
        for container in spec.get("initContainers", []) + spec["containers"]:
            if container["name"] == "static-proxy":
                continue
            mounts = {m["mountPath"] for m in container["volumeMounts"]}
            assert {"/tmp", "/app/var"} <= mounts, (owner["metadata"]["name"], container["name"])
