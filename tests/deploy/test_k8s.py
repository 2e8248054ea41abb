"""The Kubernetes deployment (deploy/k8s), checked offline: rendered as `kubectl apply -k`
would send it, core kinds validated against Kubernetes' own schemas (kubernetes-validate,
strict), the KubeRay RayCluster against the CRD schema of a pinned KubeRay release (vendored
in tests/deploy/schemas), and the wiring the services rely on: settings, secrets, probes,
NATS cluster, GPUs, Ray's network isolation."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from .kustomize_render import KustomizeError, render
from .settings_scan import FIELDS, settings_read_by, single_machine_default

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
RAYCLUSTER_SCHEMA = Path(__file__).parent / "schemas" / "kuberay-v1.7.0-raycluster-v1.json"
KUBERNETES_VERSION = "1.33.0"
SERVICES = ("gateway", "scheduler", "registry", "sweeps", "telemetry", "inference", "trainer")
# Services with an HTTP API of their own: /healthz and /metrics on that port.
HTTP_PORTS = {"gateway": 8080, "telemetry": 8081}
GPU_SERVICES = ("trainer", "inference")
CUSTOM_KINDS = {("ray.io/v1", "RayCluster")}


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(K8S)


def of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_templates(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, pod template) of every workload, RayCluster groups included."""
    for o in objects:
        name = f"{o['kind']}/{o['metadata']['name']}"
        if o["kind"] in ("Deployment", "StatefulSet"):
            yield name, o["spec"]["template"]
        elif o["kind"] == "RayCluster":
            yield f"{name} head", o["spec"]["headGroupSpec"]["template"]
            for group in o["spec"]["workerGroupSpecs"]:
                yield f"{name} {group['groupName']}", group["template"]


def swarm_containers(objects: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Service name -> the containers that run it (`python -m swarm_<service>`: a Deployment
    named for it, or the RayCluster head, which runs the trainer agent)."""
    found: dict[str, list[dict[str, Any]]] = {s: [] for s in SERVICES}
    for name, deployment in of_kind(objects, "Deployment").items():
        if name in found:
            found[name] += deployment["spec"]["template"]["spec"]["containers"]
    for cluster in of_kind(objects, "RayCluster").values():
        head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        assert "python -m swarm_trainer" in " ".join(head.get("args") or []), "head: no agent"
        found["trainer"].append(head)
    return found


def env_of(container: dict[str, Any], objects: list[dict[str, Any]]) -> dict[str, str]:
    """Every variable the container gets, envFrom resolved; values from Secrets or fields are
    shown as where they come from."""
    env: dict[str, str] = {}
    sources = {
        "configMapRef": of_kind(objects, "ConfigMap"),
        "secretRef": of_kind(objects, "Secret"),
    }
    for entry in container.get("envFrom") or []:
        ((ref_kind, ref),) = entry.items()
        source = sources[ref_kind].get(ref["name"])
        assert source is not None, f"envFrom {ref_kind} {ref['name']} does not exist"
        for key, value in {**source.get("data", {}), **source.get("stringData", {})}.items():
            env[key] = f"<{ref_kind} {ref['name']}>" if ref_kind == "secretRef" else str(value)
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = str(var["value"])
        else:
            ((ref_kind, ref),) = var["valueFrom"].items()
            env[var["name"]] = f"<{ref_kind} {ref.get('name', ref.get('fieldPath'))}>"
    return env


# --- rendering and schemas ----------------------------------------------------------------


def test_renders_unique_objects(objects: list[dict[str, Any]]) -> None:
    keys = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), keys
    for o in objects:
        if o["kind"] != "Namespace":
            assert o["metadata"]["namespace"] == "swarm", o["metadata"]


def test_renderer_refuses_what_it_does_not_render(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\npatches: []\n")
    with pytest.raises(KustomizeError, match="patches"):
        render(tmp_path)


@pytest.fixture(scope="module")
def core_objects(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if (o["apiVersion"], o["kind"]) not in CUSTOM_KINDS]


def test_core_kinds_validate_strictly(core_objects: list[dict[str, Any]]) -> None:
    assert {"Deployment", "StatefulSet", "Service", "ConfigMap", "Secret", "NetworkPolicy"} <= {
        o["kind"] for o in core_objects
    }
    for o in core_objects:
        try:
            kubernetes_validate.validate(o, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{o['kind']}/{o['metadata']['name']}: {exc.message} at {exc.path}")


def test_core_validation_catches_a_misspelled_field(core_objects: list[dict[str, Any]]) -> None:
    deployment = copy.deepcopy(next(o for o in core_objects if o["kind"] == "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readynessProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


@pytest.fixture(scope="module")
def raycluster_validator() -> jsonschema.protocols.Validator:
    vendored = json.loads(RAYCLUSTER_SCHEMA.read_text())
    assert vendored["kuberay_version"] == "v1.7.0"
    assert (vendored["group"], vendored["version"], vendored["kind"]) == (
        "ray.io",
        "v1",
        "RayCluster",
    )
    schema = vendored["openAPIV3Schema"]
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def test_raycluster_validates_against_the_kuberay_crd(
    objects: list[dict[str, Any]], raycluster_validator: jsonschema.protocols.Validator
) -> None:
    clusters = [o for o in objects if o["kind"] == "RayCluster"]
    assert clusters
    for cluster in clusters:
        assert cluster["apiVersion"] == "ray.io/v1"
        errors = [f"{list(e.path)}: {e.message}" for e in raycluster_validator.iter_errors(cluster)]
        assert not errors, errors


def test_raycluster_validation_catches_a_bad_field(
    objects: list[dict[str, Any]], raycluster_validator: jsonschema.protocols.Validator
) -> None:
    cluster = copy.deepcopy(next(o for o in objects if o["kind"] == "RayCluster"))
    cluster["spec"]["workerGroupSpecs"][0]["replicas"] = "two"
    del cluster["spec"]["headGroupSpec"]["template"]
    assert len(list(raycluster_validator.iter_errors(cluster))) >= 2


# --- settings: what each service reads is set --------------------------------------------

# Read by every service, and wrong in a cluster whatever their default: NATS there has one
# user per service (deploy/nats/nats-auth.conf), the store is S3 (keys), JetStream has three
# nodes (replicas), and the gateway with no API keys lets anyone in as tenant "default".
CLUSTER_REQUIRED = {
    "nats_user",
    "nats_password",
    "s3_access_key",
    "s3_secret_key",
    "js_replicas",
    "api_keys",
    "metrics_port",
}


def required_in_k8s(service: str) -> set[str]:
    """The SWARM_ variables a service's container must set in Kubernetes: each settings field
    it reads whose default is for a single machine or is in CLUSTER_REQUIRED. Services with an
    HTTP port serve /metrics there, so SWARM_METRICS_HOST/PORT (the others' /metrics server,
    which their probes and Prometheus use) are not theirs to set."""
    fields = {
        f for f in settings_read_by(service) if single_machine_default(f) or f in CLUSTER_REQUIRED
    }
    if service in HTTP_PORTS:
        fields -= {"metrics_host", "metrics_port"}
    return {f"SWARM_{f.upper()}" for f in fields}


def test_settings_scan_sees_what_services_read() -> None:
    # The scan must find reads through swarm_runtime, or the test below checks nothing.
    assert {"nats_url", "nats_user", "nats_password", "js_replicas"} <= settings_read_by("sweeps")
    assert {"api_keys", "gateway_host", "store_url"} <= settings_read_by("gateway")
    assert {"worker_id", "work_dir", "store_url"} <= settings_read_by("trainer")
    assert "SWARM_GATEWAY_HOST" in required_in_k8s("gateway")
    assert "SWARM_METRICS_PORT" in required_in_k8s("scheduler")
    assert "SWARM_API_KEYS" not in required_in_k8s("scheduler")


@pytest.mark.parametrize("service", SERVICES)
def test_every_required_variable_is_set(objects: list[dict[str, Any]], service: str) -> None:
    containers = swarm_containers(objects)[service]
    assert containers, f"no container runs {service}"
    for container in containers:
        env = env_of(container, objects)
        missing = required_in_k8s(service) - set(env)
        assert not missing, f"{service} ({container['name']}) reads {sorted(missing)}, unset"
        for name, value in env.items():
            if name.startswith("SWARM_") and ("HOST" in name or "URL" in name):
                assert not re.search(r"127\.0\.0\.1|localhost", value), (name, value)
        assert env["SWARM_NATS_USER"] == service


def test_every_swarm_variable_set_is_a_setting(objects: list[dict[str, Any]]) -> None:
    for where, template in pod_templates(objects):
        for container in template["spec"]["containers"]:
            for name in env_of(container, objects):
                if name.startswith("SWARM_"):
                    field = name.removeprefix("SWARM_").lower()
                    assert field in FIELDS, f"{where}: {name} is no setting"


def test_references_resolve(objects: list[dict[str, Any]]) -> None:
    stores = {
        "secretKeyRef": of_kind(objects, "Secret"),
        "configMapKeyRef": of_kind(objects, "ConfigMap"),
    }
    for where, template in pod_templates(objects):
        for container in template["spec"]["containers"]:
            for var in container.get("env") or []:
                for kind, ref in (var.get("valueFrom") or {}).items():
                    if kind in stores:
                        source = stores[kind].get(ref["name"])
                        assert source, f"{where}: {var['name']} names missing {ref['name']}"
                        keys = {**source.get("data", {}), **source.get("stringData", {})}
                        assert ref["key"] in keys, f"{where}: {ref['name']} has no {ref['key']}"
        for volume in template["spec"].get("volumes") or []:
            if "configMap" in volume:
                assert volume["configMap"]["name"] in of_kind(objects, "ConfigMap")


def test_credentials_come_from_secrets(objects: list[dict[str, Any]]) -> None:
    secret_like = re.compile(r"(KEY|PASSWORD|TOKEN|SECRET)")
    for config in of_kind(objects, "ConfigMap").values():
        assert not [k for k in config.get("data", {}) if secret_like.search(k)], config
    for where, template in pod_templates(objects):
        for container in template["spec"]["containers"]:
            for name, value in env_of(container, objects).items():
                if secret_like.search(name) and not name.startswith("KUBERAY"):
                    assert value.startswith("<secret"), f"{where}: {name} is not from a Secret"
    secrets = of_kind(objects, "Secret")
    assert {"SWARM_S3_ACCESS_KEY", "SWARM_S3_SECRET_KEY"} <= set(secrets["swarm-s3"]["stringData"])
    assert "SWARM_API_KEYS" in secrets["swarm-api-keys"]["stringData"]


def test_store_is_an_external_s3_endpoint(objects: list[dict[str, Any]]) -> None:
    url = of_kind(objects, "ConfigMap")["swarm-config"]["data"]["SWARM_STORE_URL"]
    assert url.startswith("s3://")
    assert "endpoint=" in url


# --- probes and metrics -------------------------------------------------------------------


def named_ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports") or []}


@pytest.mark.parametrize("service", SERVICES)
def test_probes_hit_the_services_health_endpoints(
    objects: list[dict[str, Any]], service: str
) -> None:
    template = of_kind(objects, "Deployment")[service]["spec"]["template"]
    (container,) = template["spec"]["containers"]
    ports = named_ports(container)
    env = env_of(container, objects)
    if service in HTTP_PORTS:
        port = HTTP_PORTS[service]
        assert env[f"SWARM_{service.upper()}_PORT"] == str(port)
        assert env[f"SWARM_{service.upper()}_HOST"] == "0.0.0.0"
        assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    else:
        port = int(env["SWARM_METRICS_PORT"])
        assert env["SWARM_METRICS_HOST"] == "0.0.0.0"
    for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
        get = container[kind]["httpGet"]
        assert get["path"] in ("/healthz", "/metrics"), (kind, get)
        assert ports.get(get["port"], get["port"]) == port, (kind, get, ports)
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert int(annotations["prometheus.io/port"]) == port


@pytest.mark.parametrize("service", sorted(HTTP_PORTS))
def test_http_services_have_a_service(objects: list[dict[str, Any]], service: str) -> None:
    svc = of_kind(objects, "Service")[service]
    assert svc["spec"]["selector"] == {"app.kubernetes.io/name": service}
    assert svc["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert {p["port"] for p in svc["spec"]["ports"]} == {HTTP_PORTS[service]}


# --- NATS: a 3-node JetStream cluster -----------------------------------------------------


def conf_value(conf: str, key: str) -> str:
    match = re.search(rf"^\s*{key}\s*[:=]\s*(\S+)", conf, re.MULTILINE)
    assert match, f"{key} not in the config"
    return match.group(1)


def authorization_block(conf: str) -> str:
    """The block tools/k8s_nats_auth.py copies: the same function, so the test and the tool
    agree on what "the users" are."""
    path = ROOT / "tools" / "k8s_nats_auth.py"
    spec = importlib.util.spec_from_file_location("k8s_nats_auth", path)
    assert spec is not None
    assert spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    block: str = tool.authorization_block(conf)
    return block


def test_nats_statefulset_is_a_three_node_jetstream_cluster(objects: list[dict[str, Any]]) -> None:
    nats = of_kind(objects, "StatefulSet")["nats"]
    assert nats["spec"]["replicas"] == 3
    headless = of_kind(objects, "Service")[nats["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"
    config = of_kind(objects, "ConfigMap")["nats-config"]["data"]
    conf = config["nats.conf"]
    routes = re.findall(r"nats://([\w.-]+):6222", conf)
    service = nats["spec"]["serviceName"]
    assert sorted(routes) == [f"nats-{i}.{service}" for i in range(3)]
    # The same JetStream settings as deploy/nats/nats-cluster.conf, durability included.
    reference = (ROOT / "deploy" / "nats" / "nats-cluster.conf").read_text()
    for key in ("store_dir", "max_file_store", "max_memory_store", "sync_interval", "max_payload"):
        assert conf_value(conf, key) == conf_value(reference, key), key
    (container,) = nats["spec"]["template"]["spec"]["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "data")
    assert mount["mountPath"] == conf_value(conf, "store_dir")
    assert [t["metadata"]["name"] for t in nats["spec"]["volumeClaimTemplates"]] == ["data"]
    assert container["readinessProbe"]["httpGet"]["path"].startswith("/healthz?js-enabled-only")
    assert conf_value(conf, "server_name") == "$NATS_SERVER_NAME"
    assert "NATS_SERVER_NAME" in {e["name"] for e in container["env"]}
    assert of_kind(objects, "ConfigMap")["swarm-config"]["data"]["SWARM_JS_REPLICAS"] == "3"


def test_nats_users_are_those_of_nats_auth_conf(objects: list[dict[str, Any]]) -> None:
    config = of_kind(objects, "ConfigMap")["nats-config"]["data"]
    assert re.search(r"^include \./authorization\.conf$", config["nats.conf"], re.MULTILINE)
    ours = authorization_block(config["authorization.conf"])
    reference = authorization_block((ROOT / "deploy" / "nats" / "nats-auth.conf").read_text())
    assert ours == reference, (
        "deploy/k8s/nats/authorization.conf must hold deploy/nats/nats-auth.conf's "
        "authorization block as it is: run python tools/k8s_nats_auth.py"
    )
    # Every password the block reads is in the nats-server's environment, from the Secret.
    (container,) = of_kind(objects, "StatefulSet")["nats"]["spec"]["template"]["spec"]["containers"]
    env = env_of(container, objects)
    for variable in set(re.findall(r"\$(\w+_NATS_PASSWORD)", ours)):
        assert env.get(variable, "").startswith("<secretKeyRef"), variable
    users = set(re.findall(r"user:\s*(\w+)", ours))
    assert set(SERVICES) <= users


# --- GPUs, Ray ------------------------------------------------------------------------------


def gpus(container: dict[str, Any]) -> int:
    resources = container.get("resources") or {}
    return int((resources.get("limits") or {}).get("nvidia.com/gpu", 0))


@pytest.mark.parametrize("service", GPU_SERVICES)
def test_gpu_workers(objects: list[dict[str, Any]], service: str) -> None:
    template = of_kind(objects, "Deployment")[service]["spec"]["template"]
    (container,) = template["spec"]["containers"]
    assert gpus(container) >= 1
    assert (
        container["resources"]["requests"]["nvidia.com/gpu"]
        == container["resources"]["limits"]["nvidia.com/gpu"]
    )
    env = env_of(container, objects)
    worker_id = "SWARM_WORKER_ID" if service == "trainer" else "SWARM_INFERENCE_WORKER_ID"
    assert env[worker_id] == "<fieldRef metadata.name>", "each replica needs its own worker id"
    assert "RAY_ADDRESS" not in env


def test_raycluster_head_runs_the_agent_on_its_own_ray(objects: list[dict[str, Any]]) -> None:
    (cluster,) = of_kind(objects, "RayCluster").values()
    head = cluster["spec"]["headGroupSpec"]
    template = head["template"]
    assert template["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    container = template["spec"]["containers"][0]
    script = " ".join(container["args"])
    # Ray first (KubeRay's generated command, in the background), then the agent in front.
    assert script.index("$KUBERAY_GEN_RAY_START_CMD &") < script.index(
        "exec python -m swarm_trainer"
    )
    env = env_of(container, objects)
    assert env["RAY_ADDRESS"].split(":") == ["127.0.0.1", "6379"]
    assert head.get("serviceType", "ClusterIP") == "ClusterIP", "Ray's ports stay in the cluster"
    assert sum(gpus(g["template"]["spec"]["containers"][0]) * g["replicas"]
               for g in cluster["spec"]["workerGroupSpecs"]) >= 2  # fmt: skip
    annotations = template["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == int(env["SWARM_METRICS_PORT"])


def test_raycluster_ray_version_is_the_images(objects: list[dict[str, Any]]) -> None:
    # KubeRay picks its probes by rayVersion (HTTP from 2.53; before, wget, which the image
    # lacks); it must be the Ray the trainer image installs.
    (cluster,) = of_kind(objects, "RayCluster").values()
    constraints = (ROOT / "services" / "trainer" / "constraints.txt").read_text()
    pinned = re.search(r"^ray==(\S+)$", constraints, re.MULTILINE)
    assert pinned, "services/trainer/constraints.txt no longer pins ray"
    assert cluster["spec"]["rayVersion"] == pinned.group(1)


def test_ray_ports_only_reachable_from_the_ray_cluster(objects: list[dict[str, Any]]) -> None:
    (cluster,) = of_kind(objects, "RayCluster").values()
    name = cluster["metadata"]["name"]
    policies = [
        p for p in of_kind(objects, "NetworkPolicy").values()
        if p["spec"]["podSelector"].get("matchLabels") == {"ray.io/cluster": name}
    ]  # fmt: skip
    assert len(policies) == 1
    spec = policies[0]["spec"]
    assert "Ingress" in spec["policyTypes"]
    ray_ports = {6379, 8265, 10001}
    for rule in spec["ingress"]:
        peers = rule.get("from") or []
        assert peers, "an ingress rule without `from` admits everyone"
        same_cluster = all(p.get("podSelector", {}).get("matchLabels") == {"ray.io/cluster": name}
                           and "namespaceSelector" not in p for p in peers)  # fmt: skip
        if not same_cluster:
            ports = {p["port"] for p in rule.get("ports") or []}
            assert ports, "a rule for other pods must name its (non-Ray) ports"
            assert not ports & ray_ports, ports
    for svc in of_kind(objects, "Service").values():
        assert svc["spec"].get("type", "ClusterIP") == "ClusterIP", svc["metadata"]["name"]
