"""Structure of the container deployment (no Docker needed).

Parses docker-compose.yml and the Dockerfiles, checking what `docker compose up` relies on.
The packages' own rules (who imports whom) are in tests/test_architecture.py.

Long because: every check reads the same parsed compose file and Dockerfiles.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
SERVICES = ("gateway", "scheduler", "trainer", "registry", "telemetry", "sweeps", "inference")
ML_SERVICES = ("trainer", "inference")
INFRA = ("nats", "minio", "minio-init")
HTTP_PORTS = {"gateway": 8080, "telemetry": 8081}
CHECK_OVERRIDE = ROOT / "deploy" / "compose-check" / "override.yml"
VARIABLE = re.compile(r"\$\{(\w+):-([^}]*)\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # ["KEY=value", ...]
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def default_of(value: str) -> str:
    """A compose value with each ``${VAR:-default}`` as users get it: the default."""
    return VARIABLE.sub(lambda m: m.group(2), value)


def image_of(service: dict[str, Any]) -> str:
    return default_of(service["image"])


def command_of(service: dict[str, Any], key: str = "command") -> list[str]:
    cmd = service.get(key) or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def healthcheck_text(service: dict[str, Any]) -> str:
    test = (service.get("healthcheck") or {}).get("test")
    assert test, "no healthcheck"
    return test if isinstance(test, str) else " ".join(test)


def published_ports(service: dict[str, Any]) -> set[int]:
    ports = set()
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            ports.add(int(entry["published"]))
        else:
            # "8080:8080", "127.0.0.1:8080:8080", "8080:8080/tcp"
            parts = default_of(str(entry)).split("/")[0].split(":")
            ports.add(int(parts[-2] if len(parts) > 1 else parts[-1]))
    return ports


def dockerfile(name: str) -> str:
    return (ROOT / "services" / name / "Dockerfile").read_text()


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


# --- compose: services and images -------------------------------------------------------


def test_services_present(services: dict[str, Any]) -> None:
    assert set(INFRA) | set(SERVICES) <= set(services)


def test_shared_env_anchor(compose: dict[str, Any]) -> None:
    assert re.search(r"^x-swarm-env:\s*&\S+", COMPOSE.read_text(), re.MULTILINE)
    shared = compose["x-swarm-env"]
    assert {
        "SWARM_NATS_URL",
        "SWARM_STORE_URL",
        "SWARM_S3_ACCESS_KEY",
        "SWARM_S3_SECRET_KEY",
    } <= set(shared)


def test_images_pinned(services: dict[str, Any]) -> None:
    for name, service in services.items():
        image = service.get("image")
        if image is not None:
            image = default_of(image)
        if image is None:
            assert "build" in service, f"{name}: neither image nor build"
            continue
        last = image.rsplit("/", 1)[-1]
        assert ":" in last or "@sha256:" in image, f"{name}: {image} has no tag"
        tag = last.split("@")[0].partition(":")[2]
        assert tag, f"{name}: {image} is not pinned"
        assert tag != "latest", f"{name}: {image} is not pinned"
        if "build" not in service:
            assert tag not in ("stable", "edge", "main", "master"), f"{name}: {image}"


def test_pulled_images_are_variables(services: dict[str, Any]) -> None:
    # Every image compose pulls can be swapped for a locally built one (`make compose-check`
    # does, offline), without a second compose file: ${VAR:-public default}.
    seen = set()
    for name, service in services.items():
        if "build" in service:
            continue
        match = VARIABLE.fullmatch(service["image"])
        assert match, f"{name}: image {service['image']} is not ${{VAR:-default}}"
        seen.add(match.group(1))
    assert {"NATS_IMAGE", "S3_IMAGE", "S3_INIT_IMAGE"} <= seen


@pytest.mark.parametrize("name", SERVICES)
def test_build_base_is_a_variable(services: dict[str, Any], name: str) -> None:
    args = services[name]["build"]["args"]
    assert args["BASE_IMAGE"] == "${BASE_IMAGE:-python:3.11-slim}"
    if name in ML_SERVICES:
        assert args["TORCH_INDEX_URL"] == "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
        assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in dockerfile(name)


def test_check_override_only_substitutes(services: dict[str, Any]) -> None:
    """deploy/compose-check/override.yml (make compose-check) changes only what the S3
    stand-in needs and where builds fetch from: no image, environment, port or dependency of
    its own, so that the check runs what users run."""
    override = yaml.safe_load(CHECK_OVERRIDE.read_text())
    assert set(override) <= {"services"} | {k for k in override if k.startswith("x-")}
    for name, service in override["services"].items():
        assert name in services, f"{name} is not in docker-compose.yml"
        if name in ("minio", "minio-init"):
            assert set(service) <= {"command", "entrypoint", "healthcheck"}, (name, service)
        else:
            assert set(service) == {"build"}, (name, service)
            assert service["build"] == {"network": "host"}


def test_healthcheck_arguments_have_no_spaces(services: dict[str, Any]) -> None:
    # podman 4.3's Docker API joins a CMD check's arguments and splits them again on spaces:
    # `python -c "import a; b"` became `python -c import a; b` (a SyntaxError), so the service
    # never got healthy under `make compose-check`. Docker keeps them; both work without spaces.
    override = yaml.safe_load(CHECK_OVERRIDE.read_text())["services"]
    for name, service in [*services.items(), *override.items()]:
        test = (service.get("healthcheck") or {}).get("test")
        if isinstance(test, list) and test[0] == "CMD":
            spaced = [arg for arg in test[1:] if re.search(r"\s", arg)]
            assert not spaced, f"{name}: {spaced}"


def test_bind_mounts_exist(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for volume in service.get("volumes") or []:
            source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name}: {source} is missing"


# --- compose: NATS and MinIO ----------------------------------------------------------------


def test_nats_jetstream_monitoring_healthcheck(
    services: dict[str, Any], compose: dict[str, Any]
) -> None:
    nats = services["nats"]
    assert image_of(nats).startswith("nats:")
    cmd = command_of(nats)
    # JetStream, its store dir and monitoring come from the mounted config: nats-server 2.10
    # refuses a store dir given both there and on the command line (seen running it).
    assert not {"-sd", "--store_dir", "-js", "--jetstream", "-m", "--http_port"} & set(cmd)
    config_flag = next(f for f in ("-c", "--config") if f in cmd)
    target = cmd[cmd.index(config_flag) + 1]
    mount = next(v for v in nats["volumes"] if isinstance(v, str) and f":{target}" in v)
    conf = (ROOT / mount.split(":")[0]).read_text()
    assert re.search(r"^jetstream\s*\{", conf, re.MULTILINE)
    assert re.search(r"^http_port:\s*8222$", conf, re.MULTILINE)
    data_dir = re.search(r"^\s*store_dir:\s*(\S+)", conf, re.MULTILINE).group(1)  # type: ignore[union-attr]
    targets = [v.split(":")[1] for v in nats["volumes"] if isinstance(v, str)]
    assert data_dir in targets, "JetStream's store dir must be on a volume"
    named = [v.split(":")[0] for v in nats["volumes"] if not v.startswith((".", "/"))]
    assert set(named) <= set(compose.get("volumes") or {})
    check = healthcheck_text(nats)
    assert "8222/healthz" in check
    assert "js-enabled" in check
    assert "wget" in check or "curl" in check


def test_minio_and_bucket_init(services: dict[str, Any]) -> None:
    minio = services["minio"]
    assert image_of(minio).startswith(("minio/minio:", "quay.io/minio/minio:"))
    assert "server" in command_of(minio)
    assert "--console-address" in command_of(minio)
    assert minio.get("volumes")
    check = healthcheck_text(minio)
    assert "mc ready local" in check or "/minio/health/live" in check
    assert 9001 in published_ports(minio)  # the console

    init = services["minio-init"]
    assert image_of(init).startswith(("minio/mc:", "quay.io/minio/mc:"))
    assert init["depends_on"]["minio"]["condition"] == "service_healthy"
    script = " ".join(command_of(init, "entrypoint") + command_of(init))
    assert "mc mb" in script
    assert "/swarm" in script
    assert "--ignore-existing" in script or "-p" in script.split(), "must be re-runnable"
    assert init.get("restart", "no") == "no"


# --- compose: the Swarm services ------------------------------------------------------------


@pytest.mark.parametrize("name", SERVICES)
def test_service_build(services: dict[str, Any], name: str) -> None:
    build = services[name]["build"]
    assert isinstance(build, dict), "build needs a context (the repo root) and a dockerfile"
    context = (ROOT / build.get("context", ".")).resolve()
    assert context == ROOT, "the build context must be the repo root (for libs/)"
    path = context / build["dockerfile"]
    assert path == ROOT / "services" / name / "Dockerfile"
    assert path.is_file()


@pytest.mark.parametrize("name", SERVICES)
def test_service_env_wiring(services: dict[str, Any], name: str) -> None:
    env = env_of(services[name])
    nats = urlparse(env["SWARM_NATS_URL"])
    assert nats.scheme == "nats"
    assert nats.hostname == "nats"
    assert nats.port == 4222
    store = urlparse(env["SWARM_STORE_URL"])
    assert store.scheme == "s3"
    assert store.netloc == "swarm"
    endpoint = urlparse(parse_qs(store.query)["endpoint"][0])
    assert endpoint.hostname == "minio"
    assert endpoint.port == 9000
    assert env["SWARM_S3_ACCESS_KEY"]
    assert env["SWARM_S3_SECRET_KEY"]
    # The same credentials as the MinIO root user.
    minio_env = env_of(services["minio"])
    assert env["SWARM_S3_ACCESS_KEY"] == minio_env["MINIO_ROOT_USER"]
    assert env["SWARM_S3_SECRET_KEY"] == minio_env["MINIO_ROOT_PASSWORD"]


@pytest.mark.parametrize("name", SERVICES)
def test_service_depends_on(services: dict[str, Any], name: str) -> None:
    deps = services[name]["depends_on"]
    assert deps["nats"]["condition"] == "service_healthy"
    assert deps["minio"]["condition"] == "service_healthy"
    assert deps["minio-init"]["condition"] == "service_completed_successfully"


@pytest.mark.parametrize("name", sorted(HTTP_PORTS))
def test_http_services_healthcheck_and_port(services: dict[str, Any], name: str) -> None:
    service, port = services[name], HTTP_PORTS[name]
    check = healthcheck_text(service)
    assert f":{port}/healthz" in check
    # The image has no curl/wget: the check must use what is there.
    assert check.split()[0] in ("CMD", "CMD-SHELL")
    assert "python" in check
    assert port in published_ports(service)
    env = env_of(service)
    assert env[f"SWARM_{name.upper()}_HOST"] == "0.0.0.0", "must listen beyond loopback"
    assert env.get(f"SWARM_{name.upper()}_PORT", str(port)) == str(port)


# --- Dockerfiles ------------------------------------------------------------------------


@pytest.mark.parametrize("name", SERVICES)
def test_dockerfile(name: str) -> None:
    instructions = dockerfile_instructions(dockerfile(name))
    froms = [args for word, args in instructions if word == "FROM"]
    assert froms
    # The base is a build argument (compose's BASE_IMAGE) whose default is the public image.
    assert froms[-1].split()[0] == "${BASE_IMAGE}"
    args = [a for word, a in instructions if word == "ARG"]
    assert "BASE_IMAGE=python:3.11-slim" in args
    assert instructions[0] == ("ARG", "BASE_IMAGE=python:3.11-slim"), "ARG before FROM"

    runs = [args for word, args in instructions if word == "RUN"]
    install = next((r for r in runs if "./libs/common/runtime" in r and "pip install" in r), None)
    assert install, "must pip install ./libs/common/contracts ./libs/common/runtime"
    assert "./libs/common/contracts" in install
    assert f"./services/{name}" in install
    assert "--no-cache-dir" in install

    copies = " ".join(args for word, args in instructions if word in ("COPY", "ADD"))
    others = [o for o in SERVICES if o != name and f"services/{o}" in copies]
    assert not others, f"{name}'s image copies other services: {others}"
    # The batched generation (torch, transformers) goes into the ML services' images only.
    generation = "libs/generation" in copies and "./libs/generation" in install
    assert generation == (name in ML_SERVICES), f"{name}: libs/generation in its image"

    users = [args for word, args in instructions if word == "USER"]
    assert users, "must run as a non-root user"
    assert users[-1] not in ("root", "0"), "must run as a non-root user"

    cmd = [args for word, args in instructions if word in ("CMD", "ENTRYPOINT")][-1]
    assert re.sub(r"\s", "", cmd) == f'["python","-m","swarm_{name}"]'


@pytest.mark.parametrize("name", ML_SERVICES)
def test_ml_dockerfiles_install_cpu_torch_first(name: str) -> None:
    runs = [args for word, args in dockerfile_instructions(dockerfile(name)) if word == "RUN"]
    torch_at = next(i for i, r in enumerate(runs) if "torch==2.13.0" in r)
    assert "download.pytorch.org/whl/" in runs[torch_at] or "TORCH_INDEX_URL" in runs[torch_at]
    text = dockerfile(name)
    assert "download.pytorch.org/whl/cpu" in text
    service_at = next(i for i, r in enumerate(runs) if f"./services/{name}" in r)
    assert torch_at < service_at


@pytest.mark.parametrize("name", [s for s in SERVICES if s not in ML_SERVICES])
def test_light_dockerfiles_do_not_install_torch(name: str) -> None:
    assert "torch" not in dockerfile(name)


def test_dockerignore() -> None:
    lines = {
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", ".swarm"} <= lines
    assert "libs" not in lines
    assert "services" not in lines


# --- compose: the observability profile ---------------------------------------------------

OBSERVABILITY = ("otel-collector", "prometheus", "jaeger")
DEPLOY = ROOT / "deploy"


def load_yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path.relative_to(ROOT)} is not a YAML mapping"
    return data


def container_ports(service: dict[str, Any]) -> set[int]:
    """Ports a container listens on as far as compose says: published targets and expose."""
    ports = {int(str(p).split("/")[0]) for p in service.get("expose") or []}
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            ports.add(int(entry["target"]))
        else:
            ports.add(int(str(entry).split("/")[0].split(":")[-1]))
    return ports


def mounted_config(service: dict[str, Any], target_dir: str) -> Path:
    """The repo file a service mounts under ``target_dir`` (its config)."""
    for volume in service.get("volumes") or []:
        source, _, rest = str(volume).partition(":")
        if source.startswith("./") and rest.startswith(target_dir):
            return ROOT / source
    raise AssertionError(f"no ./deploy file mounted under {target_dir}")


@pytest.mark.parametrize("name", OBSERVABILITY)
def test_observability_services_are_optional(services: dict[str, Any], name: str) -> None:
    # Only in the profile: a plain `docker compose up` must not start (or pull) them.
    assert services[name].get("profiles") == ["observability"]


def test_core_services_are_not_in_a_profile(services: dict[str, Any]) -> None:
    for name in (*INFRA, *SERVICES):
        assert not services[name].get("profiles"), f"{name} must start without a profile"
        deps = services[name].get("depends_on") or {}
        # Depending on a profile-only service breaks `docker compose up` without the profile.
        assert not set(deps) & set(OBSERVABILITY), f"{name} depends on {set(deps)}"


def test_observability_images(services: dict[str, Any]) -> None:
    # Pinned like the rest (test_images_pinned checks "not latest" for every service).
    assert image_of(services["otel-collector"]).startswith("otel/opentelemetry-collector-contrib:")
    assert image_of(services["prometheus"]).startswith("prom/prometheus:v")
    assert image_of(services["jaeger"]).startswith("jaegertracing/all-in-one:1.")
    for name in OBSERVABILITY:
        tag = image_of(services[name]).rsplit(":", 1)[1]
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: {tag} is not an exact version"


def test_observability_config_files_parse() -> None:
    for name in ("otel-collector.yaml", "prometheus.yml"):
        assert (DEPLOY / name).is_file(), f"deploy/{name} is missing"
        load_yaml(DEPLOY / name)


def test_collector_wiring(services: dict[str, Any]) -> None:
    service = services["otel-collector"]
    config_path = mounted_config(service, "/etc/otelcol-contrib/")
    assert config_path == DEPLOY / "otel-collector.yaml"
    target = next(v for v in service["volumes"] if str(v).startswith("./deploy/otel"))
    target = target.split(":")[1]
    assert any(target in arg for arg in command_of(service)), "the command must load the file"
    config = load_yaml(config_path)

    # OTLP in, on all interfaces (the collector's default is localhost only since v0.104).
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"] == "0.0.0.0:4317"
    assert protocols["http"]["endpoint"] == "0.0.0.0:4318"
    assert {4317, 4318} <= container_ports(service)

    pipelines = config["service"]["pipelines"]
    declared = {kind: set(config.get(kind) or {}) for kind in ("receivers", "processors")}
    declared["exporters"] = set(config["exporters"])
    for pipeline in pipelines.values():
        for kind, names in declared.items():
            assert set(pipeline.get(kind) or []) <= names, f"undeclared {kind} in {pipeline}"
        assert "otlp" in pipeline["receivers"]
    assert set(config["service"].get("extensions") or []) <= set(config.get("extensions") or {})

    # Traces go to Jaeger's OTLP port, inside the compose network.
    trace_exporters = pipelines["traces"]["exporters"]
    to_jaeger = [
        config["exporters"][e] for e in trace_exporters if e.split("/")[0] in ("otlp", "otlphttp")
    ]
    assert to_jaeger, f"traces are not exported over OTLP: {trace_exporters}"
    endpoint = to_jaeger[0]["endpoint"]
    host, _, port = endpoint.removeprefix("http://").partition(":")
    assert host == "jaeger"
    assert int(port) in container_ports(services["jaeger"])
    assert int(port) == 4317
    assert to_jaeger[0].get("tls", {}).get("insecure") is True
    assert env_of(services["jaeger"]).get("COLLECTOR_OTLP_ENABLED") == "true"
    assert 16686 in published_ports(services["jaeger"])  # the UI

    # Metrics are re-exposed for Prometheus on a port the compose file declares.
    assert "prometheus" in pipelines["metrics"]["exporters"]
    prom_port = int(config["exporters"]["prometheus"]["endpoint"].rsplit(":", 1)[1])
    assert prom_port in container_ports(service)


def _scrape_targets(config: dict[str, Any]) -> dict[str, list[str]]:
    return {
        job["job_name"]: [t for sc in job.get("static_configs", []) for t in sc["targets"]]
        for job in config["scrape_configs"]
    }


def test_prometheus_scrapes_real_services(services: dict[str, Any]) -> None:
    service = services["prometheus"]
    config_path = mounted_config(service, "/etc/prometheus/")
    assert config_path == DEPLOY / "prometheus.yml"
    assert "--config.file=/etc/prometheus/prometheus.yml" in command_of(service)
    assert 9090 in published_ports(service)
    targets = _scrape_targets(load_yaml(config_path))
    assert targets, "no scrape jobs"

    scraped: set[str] = set()
    for job, hosts in targets.items():
        assert hosts, f"{job} has no targets"
        for target in hosts:
            host, _, port = target.partition(":")
            if host == "localhost":  # Prometheus itself
                assert int(port) == 9090
                continue
            assert host in services, f"{job}: {host} is not a compose service"
            ports = container_ports(services[host]) | (
                {HTTP_PORTS[host]} if host in HTTP_PORTS else set()
            )
            assert int(port) in ports, f"{job}: {host} does not listen on {port}"
            scraped.add(host)
    # Every service with /metrics is scraped, and the OTLP metrics the collector re-exposes.
    assert set(SERVICES) | {"otel-collector"} <= scraped


@pytest.mark.parametrize("name", sorted(set(SERVICES) - set(HTTP_PORTS)))
def test_metrics_port_of_services_without_http_api(services: dict[str, Any], name: str) -> None:
    env = env_of(services[name])
    assert env["SWARM_METRICS_HOST"] == "0.0.0.0", "must listen beyond loopback"
    assert int(env["SWARM_METRICS_PORT"]) in container_ports(services[name])


@pytest.mark.parametrize("name", SERVICES)
def test_services_point_otlp_at_the_collector(services: dict[str, Any], name: str) -> None:
    env = env_of(services[name])
    endpoint = urlparse(env["SWARM_OTEL_ENDPOINT"].split(":-", 1)[-1].rstrip("}"))
    assert (endpoint.scheme, endpoint.hostname, endpoint.port) == ("http", "otel-collector", 4318)
    # Switchable to otlp (SWARM_OTEL_EXPORTER=otlp), and a valid Settings value either way.
    exporter = env["SWARM_OTEL_EXPORTER"]
    match = re.fullmatch(r"\$\{SWARM_OTEL_EXPORTER:-(\w+)\}", exporter)
    assert match or exporter == "otlp", exporter
    assert (match.group(1) if match else exporter) in ("none", "console", "otlp")
