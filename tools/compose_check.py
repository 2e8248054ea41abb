"""`make compose-check`: run docker-compose.yml for real on a Debian host, offline of any
image registry, and drive a whole fine-tuning through it with the `swarm` CLI.

Phases (each timed): podman, runc, docker-compose and mmdebstrap installed with apt-get when
missing; base images made from Debian packages with mmdebstrap (cached by package list under
~/.cache/swarm/compose-check); the service images built by docker-compose through
`podman system service`; the stack up, its health checks driven by a loop (podman runs them
from systemd timers, which these hosts lack); a tiny model registered, a dataset uploaded, a
job trained on the containerised trainer, its adapter pulled and chatted with through the
containerised inference worker; a scheduler and a NATS restart with a job in flight, which must
still succeed with every earlier record intact; then `down -v`. Exits non-zero on any failure.
See docs/deploy.md.

Long because: a standalone script, run alone on a fresh host; its phases read top to bottom.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from swarm_contracts.jobs import JobState

ROOT = Path(__file__).resolve().parents[1]
CHECK_DIR = ROOT / "deploy" / "compose-check"
COMPOSE_FILES = (ROOT / "docker-compose.yml", CHECK_DIR / "override.yml")
PROJECT = "swarm-check"
APT_PACKAGES = {"podman": "podman", "runc": "runc", "docker-compose": "docker-compose",
                "mmdebstrap": "mmdebstrap"}  # fmt: skip
# The services' base: bookworm's python3.11 (the CPU torch wheel is cp311), in a venv so that
# `pip install` works as on python:3.11-slim (Debian's own python refuses it: PEP 668).
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "passwd")
BASE_HOOK = 'chroot "$1" python3 -m venv /opt/venv'
BASE_ENV = "PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# nats.conf needs nats-server 2.10+ (sync_interval); bookworm has 2.9, trixie 2.10. wget: the
# compose health check, as in the public alpine image.
NATS_SUITE = "trixie"
NATS_PACKAGES = ("nats-server", "wget", "ca-certificates")
TORCH = "torch==2.13.0"
# The local torch index's port: the same one on every run, because it is part of the
# TORCH_INDEX_URL build argument, and a different one would rebuild the torch layers.
TORCH_INDEX_PORT = 39271
# The host ports compose publishes (docker-compose.yml's variables): the defaults where free.
HOST_PORTS = {
    "NATS_HOST_PORT": 4222,
    "NATS_MONITOR_HOST_PORT": 8222,
    "GATEWAY_HOST_PORT": 8080,
    "TELEMETRY_HOST_PORT": 8081,
    "S3_HOST_PORT": 9000,
    "S3_CONSOLE_HOST_PORT": 9001,
}
RESTARTED_SERVICE = "scheduler"
GATEWAY = "http://127.0.0.1:8080"  # set by run_check to the published port
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "swarm" / "compose-check"


class CheckFailed(Exception):
    pass


def log(message: str) -> None:
    print(f"[compose-check] {message}", flush=True)


def sh(
    cmd: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    capture: bool = False,
    timeout: float | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        list(cmd), env=env, text=True, capture_output=capture, timeout=timeout, cwd=ROOT
    )
    if check and done.returncode != 0:
        detail = f"\n{done.stdout}\n{done.stderr}" if capture else ""
        raise CheckFailed(f"`{' '.join(cmd)}` exited {done.returncode}{detail}")
    return done


class Phases:
    """Each phase's wall time, printed as it ends and summed at the end."""

    def __init__(self) -> None:
        self.times: list[tuple[str, float]] = []

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        log(f"--- {name}")
        start = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - start
            self.times.append((name, took))
            log(f"--- {name}: {took:.1f} s")

    def summary(self) -> str:
        rows = [f"  {name:<34} {took:8.1f} s" for name, took in self.times]
        rows.append(f"  {'total':<34} {sum(t for _, t in self.times):8.1f} s")
        return "\n".join(rows)


# --- host prerequisites -------------------------------------------------------------------


def install_prerequisites() -> None:
    missing = [pkg for cmd, pkg in APT_PACKAGES.items() if shutil.which(cmd) is None]
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise CheckFailed(f"missing {missing} and no apt-get: install them (docs/deploy.md)")
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    log(f"installing {' '.join(missing)} with apt-get")
    sh([*sudo, "apt-get", "update", "-q"])
    apt_env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    sh([*sudo, "apt-get", "install", "-y", "-q", *missing], env=apt_env)


def podman_env() -> dict[str, str]:
    # The project's containers.conf, not the host's: runc, cgroupfs, ulimits (the file says why).
    return {**os.environ, "CONTAINERS_CONF": str(CHECK_DIR / "containers.conf")}


def host_ports() -> dict[str, str]:
    """Each published port's default where it is free, else a free one (a host running its
    own nats-server on 4222 is common)."""
    chosen = {}
    for var, port in HOST_PORTS.items():
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                s.bind(("0.0.0.0", 0))
                log(f"host port {port} is taken: {var}={s.getsockname()[1]}")
            chosen[var] = str(s.getsockname()[1])
    return chosen


# --- images -------------------------------------------------------------------------------


def debian_image(
    name: str, suite: str, packages: Sequence[str], hook: str | None, changes: Sequence[str]
) -> str:
    """A local image of ``packages`` from ``suite``, made once per package list."""
    key = hashlib.sha256(
        json.dumps([suite, sorted(packages), hook, list(changes)]).encode()
    ).hexdigest()[:12]
    image = f"localhost/swarm-check-{name}:{key}"
    env = podman_env()
    if sh(["podman", "image", "exists", image], env=env, check=False).returncode == 0:
        log(f"{image}: cached")
        return image
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / f"{name}-{key}.tar"
    if not tarball.exists():
        log(f"mmdebstrap {suite} {' '.join(packages)} (a few minutes, once)")
        partial = tarball.with_suffix(".partial.tar")
        cmd = ["mmdebstrap", "--variant=minbase", f"--include={','.join(packages)}"]
        if hook:
            cmd.append(f"--customize-hook={hook}")
        sh([*cmd, suite, str(partial)])
        partial.rename(tarball)
    change_args = [arg for change in changes for arg in ("--change", change)]
    sh(["podman", "import", "--quiet", *change_args, str(tarball), image], env=env, capture=True)
    return image


def trusting_host_cas(image: str) -> str:
    """``image`` with the host's CA bundle: where PyPI is reached through a TLS-intercepting
    proxy, the host trusts its CA and pip in the image builds must too."""
    bundle = Path(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt")
    if not bundle.is_file():
        return image
    data = bundle.read_bytes()
    key = hashlib.sha256(image.encode() + data).hexdigest()[:12]
    out = f"localhost/swarm-check-base-cas:{key}"
    env = podman_env()
    if sh(["podman", "image", "exists", out], env=env, check=False).returncode == 0:
        return out
    with tempfile.TemporaryDirectory() as context:
        (Path(context) / "ca-certificates.crt").write_bytes(data)
        (Path(context) / "Containerfile").write_text(
            f"FROM {image}\n"
            "COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt\n"
            "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt\n"
        )
        sh(["podman", "build", "--quiet", "-t", out, context], env=env, capture=True)
    return out


def build_s3_standin(base: str) -> str:
    image = f"localhost/swarm-check-s3:{base.rsplit(':', 1)[1]}"
    sh(
        ["podman", "build", "--quiet", "--network", "host", "--build-arg", f"BASE_IMAGE={base}",
         "-f", str(CHECK_DIR / "s3-standin.Containerfile"), "-t", image, str(CHECK_DIR)],
        env=podman_env(),
    )  # fmt: skip
    return image


def torch_reachable() -> bool:
    try:
        socket.getaddrinfo("download.pytorch.org", 443)
    except OSError:
        return False
    return True


def torch_index(stack: contextlib.ExitStack) -> str:
    """The TORCH_INDEX_URL the trainer and inference images build with.

    download.pytorch.org's CPU index where it is reachable; else a PEP 503 index served from
    here, of the CPU wheel pip finds locally (this host's find-links) and its dependencies."""
    if os.environ.get("TORCH_INDEX_URL"):
        return os.environ["TORCH_INDEX_URL"]
    if torch_reachable():
        return "https://download.pytorch.org/whl/cpu"
    wheels = CACHE / "torch-wheels"
    if not any(wheels.glob("torch-2.13.0+cpu-*.whl")):
        log(f"download.pytorch.org is unreachable: collecting {TORCH} (CPU) and its dependencies")
        sh([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
            "-d", str(wheels), TORCH])  # fmt: skip
        if not any(wheels.glob("torch-2.13.0+cpu-*.whl")):
            raise CheckFailed("pip found no CPU torch wheel (torch-2.13.0+cpu) here")
    simple = CACHE / "torch-index"
    shutil.rmtree(simple, ignore_errors=True)
    projects: dict[str, list[str]] = {}
    for wheel in wheels.glob("*.whl"):
        project = wheel.name.split("-")[0].lower().replace("_", "-").replace(".", "-")
        projects.setdefault(project, []).append(wheel.name)
    for project, files in projects.items():
        (simple / project).mkdir(parents=True)
        links = "".join(f'<a href="/files/{f}">{f}</a>\n' for f in sorted(files))
        (simple / project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    (simple / "files").symlink_to(wheels)

    handler = functools.partial(QuietHandler, directory=str(simple))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", TORCH_INDEX_PORT), handler)
    except OSError:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stack.callback(server.shutdown)
    return f"http://127.0.0.1:{server.server_address[1]}/"


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


# --- podman's Docker API and compose ------------------------------------------------------


def podman_service(stack: contextlib.ExitStack, run_dir: Path) -> str:
    sock = run_dir / "podman.sock"
    log_file = (run_dir / "podman-service.log").open("w")
    proc = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{sock}"],
        env=podman_env(),
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log_file.close()

    stack.callback(stop)
    deadline = time.monotonic() + 30
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise CheckFailed(f"podman system service did not start: {run_dir}/podman-service.log")
        time.sleep(0.2)
    return f"unix://{sock}"


class Compose:
    def __init__(self, docker_host: str, images: dict[str, str]) -> None:
        self.env = {**podman_env(), "DOCKER_HOST": docker_host, **images}
        self.base = ["docker-compose", "-p", PROJECT]
        for f in COMPOSE_FILES:
            self.base += ["-f", str(f)]

    def __call__(self, *args: str, timeout: float | None = None, capture: bool = False) -> str:
        return sh([*self.base, *args], env=self.env, timeout=timeout, capture=capture).stdout

    def container(self, service: str) -> str:
        ids = self("ps", "-q", service, capture=True).split()
        if not ids:
            raise CheckFailed(f"no container for {service}")
        return ids[0]


class HealthDriver:
    """Runs `podman healthcheck run` on every container with a health check, every few
    seconds: podman schedules health checks with systemd timers, which this host lacks, so
    without this they would stay `starting` and `service_healthy` would never be met."""

    def __init__(self, services: dict[str, float], tick: float = 1.0) -> None:
        self.services = services  # name -> its check's interval (s), as compose sets it
        self.tick = tick
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def __enter__(self) -> HealthDriver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=30)

    def loop(self) -> None:
        env = podman_env()
        due = dict.fromkeys(self.services, 0.0)
        while not self.stopped.wait(self.tick):
            for service, interval in self.services.items():
                # At the compose interval, not faster: each failure counts toward `retries`.
                if time.monotonic() < due[service]:
                    continue
                due[service] = time.monotonic() + interval
                names = subprocess.run(
                    ["podman", "ps", "-q",
                     "--filter", f"label=com.docker.compose.project={PROJECT}",
                     "--filter", f"label=com.docker.compose.service={service}"],
                    env=env, capture_output=True, text=True, check=False,
                ).stdout.split()  # fmt: skip
                for name in names:
                    subprocess.run(
                        ["podman", "healthcheck", "run", name],
                        env=env, capture_output=True, check=False, timeout=30,
                    )  # fmt: skip


def services_with_healthcheck() -> dict[str, float]:
    """Service -> its health check's interval in seconds (compose's default: 30 s)."""
    checks: dict[str, dict[str, Any]] = {}
    for path in COMPOSE_FILES:
        for name, service in (yaml.safe_load(path.read_text()).get("services") or {}).items():
            if (service or {}).get("healthcheck") and not (service or {}).get("profiles"):
                checks.setdefault(name, {}).update(service["healthcheck"])
    return {name: seconds(check.get("interval", "30s")) for name, check in checks.items()}


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    number, unit = re.fullmatch(r"([\d.]+)(ms|s|m|h)", duration).groups()  # type: ignore[union-attr]
    return float(number) * units[unit]


def wait_healthy(compose: Compose, services: Sequence[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(services)
    while pending:
        states = {
            s: sh(["podman", "inspect", "--format", "{{.State.Health.Status}}",
                   compose.container(s)], env=compose.env, capture=True).stdout.strip()
            for s in pending
        }  # fmt: skip
        pending = [s for s, state in states.items() if state != "healthy"]
        if pending and time.monotonic() > deadline:
            raise CheckFailed(f"not healthy after {timeout:.0f} s: {states}")
        time.sleep(2)


def wait_gateway(timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{GATEWAY}/healthz", timeout=3) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise CheckFailed(f"the gateway at {GATEWAY} is not answering")
        time.sleep(1)


# --- the swarm CLI, from the host ---------------------------------------------------------


def swarm(*args: str, timeout: float = 300) -> str:
    cli = Path(sys.executable).with_name("swarm")
    env = {**os.environ, "SWARM_GATEWAY_URL": GATEWAY}
    env.pop("SWARM_API_KEY", None)
    done = sh([str(cli), *args], env=env, capture=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise CheckFailed(f"`swarm {' '.join(args)}` exited {done.returncode}:\n"
                          f"{done.stdout}\n{done.stderr}")  # fmt: skip
    return done.stdout


def swarm_json(*args: str, timeout: float = 300) -> Any:
    return json.loads(swarm(*args, "--json", timeout=timeout))


def job_spec(path: Path, name: str, train: str, val: str, steps: int) -> Path:
    from swarm.demo import demo_spec

    spec = demo_spec(train, val, steps)
    spec["name"] = name
    path.write_text(yaml.safe_dump(spec))
    return path


TERMINAL = tuple(s.value for s in JobState if s.terminal)


def wait_job(job_id: str, timeout: float, until: Sequence[str] = ()) -> dict[str, Any]:
    """The job's record once it is in a state of ``until`` or has ended."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            record: dict[str, Any] = swarm_json("jobs", "show", job_id)
        except CheckFailed as exc:
            # A gateway still reconnecting to a restarted NATS answers 503 for a moment.
            if time.monotonic() > deadline:
                raise
            log(f"retrying: {str(exc).splitlines()[0]}")
            time.sleep(2)
            continue
        if record["state"] in (*until, *TERMINAL):
            return record
        if time.monotonic() > deadline:
            raise CheckFailed(f"job {job_id} still {record['state']} after {timeout:.0f} s")
        time.sleep(2)


def wait_served(model: str, timeout: float) -> None:
    name, _, version = model.partition("@")
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(f"{GATEWAY}/v1/models", timeout=5) as r:
            served = json.load(r)
        for entry in served.get("data", []):
            same = entry.get("name") == name and str(entry.get("version")) == version
            if same and entry.get("served"):
                return
        if time.monotonic() > deadline:
            raise CheckFailed(f"no inference worker serves {model}: {served}")
        time.sleep(2)


# --- the check ----------------------------------------------------------------------------


def run_check(args: argparse.Namespace, phases: Phases, stack: contextlib.ExitStack) -> None:
    with phases("prerequisites (apt-get)"):
        install_prerequisites()
    with phases("base images (mmdebstrap, cached)"):
        base = debian_image("base", BASE_SUITE, BASE_PACKAGES, BASE_HOOK, [f"ENV {BASE_ENV}"])
        base = trusting_host_cas(base)
        nats = debian_image(
            "nats", NATS_SUITE, NATS_PACKAGES, None, ['ENTRYPOINT ["/usr/sbin/nats-server"]']
        )
        s3 = build_s3_standin(base)
    ports = host_ports()
    global GATEWAY
    GATEWAY = f"http://127.0.0.1:{ports['GATEWAY_HOST_PORT']}"
    images = {**ports, "BASE_IMAGE": base, "NATS_IMAGE": nats, "S3_IMAGE": s3, "S3_INIT_IMAGE": s3,
              "TORCH_INDEX_URL": torch_index(stack)}  # fmt: skip
    log(f"images: {images}")
    run_dir = Path(tempfile.mkdtemp(prefix="swarm-compose-check-"))
    stack.callback(shutil.rmtree, run_dir, ignore_errors=True)
    compose = Compose(podman_service(stack, run_dir), images)

    with phases("service images (docker-compose build)"):
        compose("build", timeout=3600)

    stack.enter_context(HealthDriver(services_with_healthcheck()))
    if not args.keep:
        stack.callback(lambda: compose("down", "-v", "--remove-orphans", timeout=300))
    try:
        with phases("up (until healthy)"):
            compose("up", "-d", timeout=900)
            wait_healthy(compose, services_with_healthcheck(), timeout=300)
            wait_gateway(timeout=120)
        work = run_dir / "work"
        work.mkdir()
        with phases("register the tiny model"):
            swarm("models", "create-tiny", str(work / "tiny-llama"))
            model = swarm_json("models", "add", "tiny-llama", str(work / "tiny-llama"))
            base_ref = f"{model['name']}@{model['version']}"
        with phases("upload datasets"):
            from swarm.demo_data import write_demo_datasets

            train_path, val_path = write_demo_datasets(work / "data")
            train = swarm_json("datasets", "upload", str(train_path))["id"]
            val = swarm_json("datasets", "upload", str(val_path))["id"]
        with phases("train a job (containerised trainer)"):
            spec = job_spec(work / "job.yaml", "compose-check", train, val, args.steps)
            first = swarm_json("submit", str(spec), timeout=60)
            record = wait_job(first["job_id"], timeout=args.job_timeout)
            if record["state"] != "succeeded":
                raise CheckFailed(f"job {first['job_id']} {record['state']}: {record}")
            adapter = record["adapter"]
            adapter_ref = f"{adapter['name']}@{adapter['version']}"
        with phases("pull the adapter"):
            out = work / "adapter"
            swarm("adapters", "pull", adapter_ref, "--out", str(out))
            for name in ("adapter_config.json", "adapter_model.safetensors"):
                if not (out / name).is_file():
                    raise CheckFailed(f"`swarm adapters pull` left no {name} in {out}")
        with phases("chat (containerised inference)"):
            wait_served(base_ref, timeout=180)
            answer = swarm_json(
                "chat", adapter_ref, "--prompt", "reverse moon ->", "--max-tokens", "8",
                "--temperature", "0", timeout=180,
            )  # fmt: skip
            # What it says is up to 20 steps of training; that a worker generated it is not.
            if not answer.get("worker") or answer["usage"]["completion_tokens"] < 1:
                raise CheckFailed(f"no answer generated by an inference worker: {answer}")
            log(f"{adapter_ref} answered: {json.dumps(answer)[:300]}")
        with phases(f"restart {RESTARTED_SERVICE} and nats mid-job"):
            # Longer than the first, so that the restarts land while it trains.
            spec = job_spec(work / "job2.yaml", "compose-check-2", train, val, 3 * args.steps)
            in_flight = swarm_json("submit", str(spec), timeout=60)["job_id"]
            state = wait_job(in_flight, timeout=args.job_timeout, until=("running",))["state"]
            log(f"job {in_flight} is {state}: restarting {RESTARTED_SERVICE}, then nats")
            sh(["podman", "restart", compose.container(RESTARTED_SERVICE)], env=compose.env)
            sh(["podman", "restart", compose.container("nats")], env=compose.env)
            wait_healthy(compose, services_with_healthcheck(), timeout=300)
            wait_gateway(timeout=120)  # /healthz: 503 until it has NATS again
            record = wait_job(in_flight, timeout=args.job_timeout)
            if record["state"] != "succeeded":
                raise CheckFailed(f"job {in_flight} (in flight at the restart) {record['state']}")
            again = swarm_json("jobs", "show", first["job_id"])
            if again["state"] != "succeeded" or again["adapter"] != adapter:
                raise CheckFailed(f"the first job's record changed across the restart: {again}")
            if adapter_ref not in {f"{a['name']}@{a['version']}"
                                   for a in swarm_json("adapters", "ls")}:  # fmt: skip
                raise CheckFailed(f"{adapter_ref} is gone from the registry after the restart")
            if not {train, val} <= {d["id"] for d in swarm_json("datasets", "ls")}:
                raise CheckFailed("datasets are gone after the restart")
            log(f"job {in_flight} submitted before the restarts succeeded; records intact")
    except BaseException:
        with contextlib.suppress(Exception):
            print(compose("ps", capture=True))
            print(compose("logs", "--no-color", "--tail", "60", capture=True)[-20000:])
        raise
    if not args.keep:
        with phases("down -v"):
            stack.pop_all().close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps of each job")
    parser.add_argument("--job-timeout", type=float, default=600)
    parser.add_argument("--keep", action="store_true", help="leave the stack up at the end")
    args = parser.parse_args()
    phases = Phases()
    code = 0
    try:
        with contextlib.ExitStack() as stack:
            run_check(args, phases, stack)
    except (CheckFailed, subprocess.TimeoutExpired) as exc:
        log(f"FAILED: {exc}")
        code = 1
    print("\ncompose-check phases:\n" + phases.summary(), flush=True)
    log("passed" if code == 0 else "failed")
    return code


if __name__ == "__main__":
    sys.exit(main())
