"""The rules of the house, read from the source: who may import and depend on whom.

* Services talk over NATS only: no service imports another.
* ``swarm_contracts`` is pydantic and the standard library only; the SDK and every service
  depend on it. ``swarm_runtime`` (broker, store, telemetry, settings) is for services only.
* Heavy ML (torch, ray, peft, transformers, ...) only in the trainer and inference services,
  and in ``swarm_generation`` (``libs/generation``: the batched generation both of them run),
  which only they depend on and which imports torch and transformers and nothing of Swarm's.
* The SDK imports the contracts and nothing of the services' runtime, and ``pip install``
  of it brings none of the runtime's packages (checked in a fresh virtual environment).
* Every package imports only what its own pyproject brings (its requirements and theirs).
* No two modules of a package import each other, directly or round a circle.
* What a job event or state means is said once, in ``swarm_contracts.events`` and ``.jobs``:
  no list of their names anywhere else (Python or the dashboard's JS), every set derived.
* No module over 500 lines without a reason at its top (a ``Long because: ...`` line in its
  docstring).
* A setting lives in the room of whoever reads it: the runtime's shared ``Settings`` holds
  what the runtime or several services read, a service's own knobs are in its
  ``swarm_<service>/settings.py``, and each is declared once.

Long because: one file of the house's rules, each read from the source in a few lines.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from swarm_contracts.events import JOB_EVENTS
from swarm_contracts.jobs import JobState
from swarm_runtime.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
SERVICES = sorted(p.parent.name for p in (ROOT / "services").glob("*/pyproject.toml"))
ML_SERVICES = {"trainer", "inference"}
GENERATION = "libs/generation"
HEAVY = {"torch", "ray", "peft", "transformers", "bitsandbytes", "liger_kernel", "vllm"}
# What the services' runtime brings; none of it may come with the SDK.
RUNTIME_DISTRIBUTIONS = {
    "faststream",
    "nats-py",
    "minio",
    "nkeys",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "prometheus-client",
    "pydantic-settings",
    "swarm-runtime",
    "swarm-generation",
    "torch",
}


def imported_modules(package_dir: Path) -> dict[str, set[str]]:
    """Top-level modules imported by each .py file below ``package_dir`` (lazy imports and
    ``importlib.import_module("x")`` included)."""
    found: dict[str, set[str]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        if any(part.endswith(".egg-info") or part in ("build", ".venv") for part in path.parts):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        mods: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods.add(node.module.split(".")[0])
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None))
                in ("import_module", "__import__")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                mods.add(node.args[0].value.split(".")[0])
        found[str(path.relative_to(ROOT))] = mods
    return found


def offending(package_dir: Path, forbidden: set[str]) -> dict[str, list[str]]:
    return {
        path: sorted(mods & forbidden)
        for path, mods in imported_modules(package_dir).items()
        if mods & forbidden
    }


def requirement_names(pyproject: Path, skip_extras: tuple[str, ...] = ()) -> list[str]:
    project = tomllib.loads(pyproject.read_text()).get("project", {})
    reqs = list(project.get("dependencies", []))
    for name, extra in project.get("optional-dependencies", {}).items():
        if name not in skip_extras:
            reqs.extend(extra)
    names = []
    for req in reqs:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        assert match, f"{pyproject}: cannot parse {req!r}"
        names.append(re.sub(r"[-_.]+", "-", match.group(1)).lower())
    return names


def test_the_services_are_found() -> None:
    assert {"gateway", "scheduler", "trainer", "registry", "telemetry"} <= set(SERVICES)


# --- packages ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", SERVICES)
def test_service_package(name: str) -> None:
    path = ROOT / "services" / name / "pyproject.toml"
    project = tomllib.loads(path.read_text())["project"]
    assert project["name"] == f"swarm-{name}"
    assert {"swarm-contracts", "swarm-runtime"} <= set(requirement_names(path))
    assert (ROOT / "services" / name / f"swarm_{name}" / "__main__.py").is_file()


EVERY_PACKAGE = [*SERVICES, "libs/common/contracts", "libs/common/runtime", GENERATION, "sdk"]


def _pyproject(name: str) -> Path:
    return ROOT / (name if "/" in name or name == "sdk" else f"services/{name}") / "pyproject.toml"


@pytest.mark.parametrize("name", EVERY_PACKAGE)
def test_only_ml_services_depend_on_heavy_ml(name: str) -> None:
    names = {n.replace("-", "_") for n in requirement_names(_pyproject(name))}
    if name in ML_SERVICES or name == GENERATION:
        assert names & HEAVY, f"{name} should declare what it imports of {HEAVY}"
    else:
        assert not names & HEAVY, f"{name} must stay light but depends on {names & HEAVY}"


@pytest.mark.parametrize("name", EVERY_PACKAGE)
def test_only_ml_services_depend_on_the_generation_lib(name: str) -> None:
    """``swarm_generation`` brings torch and transformers: the trainer and the inference
    service depend on it, the scheduler, gateway, SDK and the rest must not."""
    depends = "swarm-generation" in requirement_names(_pyproject(name))
    if name in ML_SERVICES:
        assert depends, f"{name} imports swarm_generation: its pyproject must list it"
    else:
        assert not depends, f"{name} must stay light but depends on swarm-generation"


def test_shared_code_lives_under_libs() -> None:
    """The design's layout: the two packages every service shares under ``libs/common/``,
    and the ML services' batched generation in ``libs/generation/``; no other."""
    libs = ROOT / "libs"
    packages = sorted(str(p.parent.relative_to(libs)) for p in libs.glob("**/pyproject.toml"))
    assert packages == ["common/contracts", "common/runtime", "generation"]


def test_contracts_depend_on_pydantic_only() -> None:
    assert requirement_names(ROOT / "libs" / "common" / "contracts" / "pyproject.toml") == [
        "pydantic"
    ]


def test_sdk_depends_on_contracts_not_runtime() -> None:
    pyproject = ROOT / "sdk" / "pyproject.toml"
    # The one opt-in exception: an admin's `swarm providers add` makes nkey users.
    names = set(requirement_names(pyproject, skip_extras=("providers",)))
    assert "swarm-contracts" in names
    assert not names & RUNTIME_DISTRIBUTIONS, names & RUNTIME_DISTRIBUTIONS
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    assert [n.split(">")[0] for n in extras["providers"]] == ["nkeys"]


# --- imports ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SERVICES)
def test_services_do_not_import_each_other(name: str) -> None:
    forbidden = {f"swarm_{other}" for other in SERVICES if other != name} | {"swarm"}
    bad = offending(ROOT / "services" / name, forbidden)
    assert not bad, f"services talk over NATS only, never by import: {bad}"


@pytest.mark.parametrize("name", [s for s in SERVICES if s not in ML_SERVICES])
def test_light_services_import_no_heavy_ml(name: str) -> None:
    bad = offending(ROOT / "services" / name, HEAVY | {"swarm_generation"})
    assert not bad, f"only {sorted(ML_SERVICES)} may import {sorted(HEAVY)}: {bad}"


def test_contracts_import_pydantic_and_the_standard_library_only() -> None:
    allowed = set(sys.stdlib_module_names) | {"pydantic", "swarm_contracts", "__future__"}
    bad = {
        path: sorted(mods - allowed)
        for path, mods in imported_modules(ROOT / "libs" / "common" / "contracts").items()
        if mods - allowed
    }
    assert not bad, f"swarm_contracts is pydantic only: {bad}"


def test_runtime_imports_no_service_and_no_heavy_ml() -> None:
    forbidden = {f"swarm_{s}" for s in SERVICES} | HEAVY | {"swarm", "swarm_generation"}
    bad = offending(ROOT / "libs" / "common" / "runtime", forbidden)
    assert not bad, bad


def test_generation_imports_torch_transformers_and_the_standard_library_only() -> None:
    """No service, no runtime, no contracts: a model and a tokenizer in, tokens and text out."""
    allowed = set(sys.stdlib_module_names) | {"torch", "transformers", "swarm_generation"}
    bad = {
        path: sorted(mods - allowed - {"__future__"})
        for path, mods in imported_modules(ROOT / GENERATION).items()
        if mods - allowed - {"__future__"}
    }
    assert not bad, f"swarm_generation is torch and transformers only: {bad}"


def test_sdk_imports_neither_runtime_nor_services() -> None:
    forbidden = {f"swarm_{s}" for s in SERVICES} | HEAVY | {"swarm_runtime", "swarm_generation"}
    # The runtime's own third-party packages too: they would not be installed.
    forbidden |= {"faststream", "nats", "minio", "opentelemetry", "prometheus_client"}
    bad = offending(ROOT / "sdk", forbidden)
    assert not bad, f"the SDK must stay light: {bad}"


def module_imports(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (lazy and ``TYPE_CHECKING`` ones
    included: a circle hidden behind either is still a circle for the reader)."""
    paths = {
        ".".join(path.relative_to(package.parent).with_suffix("").parts).removesuffix(
            ".__init__"
        ): path
        for path in sorted(package.rglob("*.py"))
    }
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:  # `from pkg import submodule` imports the submodule
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in paths else node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[module] = {m for m in found if m in paths and m != module}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


PACKAGES = [
    *(ROOT / "services" / s / f"swarm_{s}" for s in SERVICES),
    ROOT / "libs" / "common" / "contracts" / "swarm_contracts",
    ROOT / "libs" / "common" / "runtime" / "swarm_runtime",
    ROOT / GENERATION / "swarm_generation",
    ROOT / "sdk" / "swarm",
]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_no_import_circles_within_a_package(package: Path) -> None:
    assert not import_circles(module_imports(package)), "modules that import each other"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def optional_imports(path: Path) -> set[str]:
    """Top-level modules imported only inside a ``try`` that catches their absence."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Try):
            continue
        caught = {
            name.id
            for handler in node.handlers
            for name in ast.walk(handler.type)
            if handler.type is not None
            if isinstance(name, ast.Name)
        }
        if not caught & {"ImportError", "ModuleNotFoundError", "Exception"}:
            continue
        for inner in (n for stmt in node.body for n in ast.walk(stmt)):
            if isinstance(inner, ast.Import):
                found.update(alias.name.split(".")[0] for alias in inner.names)
            elif isinstance(inner, ast.ImportFrom) and inner.module and inner.level == 0:
                found.add(inner.module.split(".")[0])
    return found


def installable(dist: str, seen: set[str] | None = None) -> set[str]:
    """``dist`` and every distribution its requirements bring, as installed here."""
    seen = set() if seen is None else seen
    if dist in seen:
        return seen
    seen.add(dist)
    try:
        requires = importlib.metadata.requires(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return seen
    for req in requires:
        if "extra ==" in req:
            continue
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        if match:
            installable(_norm(match.group(1)), seen)
    return seen


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_every_third_party_import_is_a_declared_dependency(package: Path) -> None:
    """A package imports only what its own pyproject brings (its requirements and theirs): an
    image built from one package's requirements must run it. (The runtime once imported
    tenacity that only the trainer declared: every service's container failed to start.)"""
    declared: set[str] = set()
    for name in requirement_names(package.parent / "pyproject.toml"):
        declared |= installable(name)
    providers = importlib.metadata.packages_distributions()
    missing = {}
    for path, mods in imported_modules(package).items():
        for mod in mods - set(sys.stdlib_module_names) - optional_imports(ROOT / path):
            if mod.startswith("swarm") or mod == "__future__":
                continue
            dists = {_norm(d) for d in providers.get(mod, [_norm(mod)])}
            if not dists & declared:
                missing.setdefault(mod, []).append(path)
    assert not missing, f"imported but not declared in {package.parent}/pyproject.toml: {missing}"


def test_an_import_circle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(graph) == [["a", "b", "c"]]


# --- meaning in one place ---------------------------------------------------------------

# Job events and job states share names (an event is often named for the state it leaves).
LIFECYCLE_NAMES = frozenset(JOB_EVENTS) | {s.value for s in JobState}
# Everything but the contracts, which say it, and the tests, which check it.
MEANING_USERS = ("services", "sdk", "libs/common/runtime", GENERATION, "tools", "bench")
JS_STRING_LIST = re.compile(
    r"""\[\s*((?:"[^"]*"|'[^']*')(?:\s*,\s*(?:"[^"]*"|'[^']*'))+)\s*,?\s*\]"""
)


def source_files(suffix: str) -> list[Path]:
    return sorted(
        path
        for top in MEANING_USERS
        for path in (ROOT / top).rglob(f"*{suffix}")
        if not any(part.endswith(".egg-info") or part in ("build", ".venv") for part in path.parts)
    )


def listed_names_py(source: str) -> list[tuple[int, list[str]]]:
    """Literal tuples, lists, sets and dict keys of two or more job event or state names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items: list[ast.expr | None] = list(node.elts)
        elif isinstance(node, ast.Dict):
            items = list(node.keys)
        else:
            continue
        names = [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
        if len(items) >= 2 and len(names) == len(items) and set(names) <= LIFECYCLE_NAMES:
            found.append((node.lineno, names))
    return found


def listed_names_js(source: str) -> list[list[str]]:
    """Array literals of two or more job event or state names."""
    found = []
    for match in JS_STRING_LIST.finditer(source):
        names = [n[1:-1] for n in re.findall(r""""[^"]*"|'[^']*'""", match.group(1))]
        if set(names) <= LIFECYCLE_NAMES:
            found.append(names)
    return found


def test_no_hand_kept_list_of_job_events_or_states() -> None:
    """Which events end a job, who sends them, the state each leaves: ``EventMeaning`` on each
    event class, ``JobState.terminal``; everyone else derives their sets from those (the
    dashboard reads them from ``/dashboard/lifecycle.json``)."""
    bad = {
        str(path.relative_to(ROOT)): listed
        for path in source_files(".py")
        if (listed := listed_names_py(path.read_text()))
    }
    bad |= {
        str(path.relative_to(ROOT)): listed
        for path in source_files(".js")
        if (listed := listed_names_js(path.read_text()))
    }
    assert not bad, f"derive these from swarm_contracts.events / JobState instead: {bad}"


def test_a_hand_kept_list_is_found() -> None:
    assert listed_names_py('if e in ("succeeded", "failed"):\n    pass\n') == [
        (1, ["succeeded", "failed"])
    ]
    assert listed_names_py('STATE = {"queued": 1, "running": 2}') == [(1, ["queued", "running"])]
    # A list that holds other names too is another thing (OpenAI's statuses, say).
    assert listed_names_py('S = ("validating_files", "queued")') == []
    assert listed_names_js('const T = new Set(["succeeded", "failed"]);') == [
        ["succeeded", "failed"]
    ]
    assert listed_names_js('["pending", "queued"]') == []


# --- settings: each in its room ------------------------------------------------------------


def service_settings(service: str) -> list[type[Settings]]:
    """The settings classes of ``swarm_<service>/settings.py`` (none: it has no knob of its own)."""
    if not (ROOT / "services" / service / f"swarm_{service}" / "settings.py").is_file():
        return []
    module = importlib.import_module(f"swarm_{service}.settings")
    return [
        c
        for c in vars(module).values()
        if isinstance(c, type) and issubclass(c, Settings) and c.__module__ == module.__name__
    ]


def settings_read(package: Path) -> set[str]:
    """Fields read as ``<...settings>.<field>`` in the package (``self.<field>`` in a settings
    module: a setting derived from another)."""
    read: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                owner = node.value
                name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
                if "settings" in name.lower() or (path.name == "settings.py" and name == "self"):
                    read.add(node.attr)
    return read


def test_each_setting_is_declared_once_in_the_room_of_who_reads_it() -> None:
    shared = set(Settings.model_fields)
    runtime_reads = settings_read(ROOT / "libs" / "common" / "runtime" / "swarm_runtime")
    reads = {s: settings_read(ROOT / "services" / s / f"swarm_{s}") for s in SERVICES}
    declared: dict[str, str] = {}
    for service in SERVICES:
        for cls in service_settings(service):
            own = set(cls.model_fields) - shared
            assert set(cls.model_fields) >= shared, f"{cls.__name__} must extend the shared ones"
            twice = {f for f in own if f in declared}
            assert not twice, f"{service} declares {twice} again ({declared})"
            declared |= dict.fromkeys(own, service)
            unread = own - reads[service]
            assert not unread, f"{service} declares settings it never reads: {unread}"
    for field in shared:
        readers = {s for s, r in reads.items() if field in r}
        assert field in runtime_reads or len(readers) >= 2, (
            f"only {readers or 'nobody'} reads the shared setting {field}: move it to its room"
        )
    assert declared, "no service settings found: the scan checks nothing"


# --- module size --------------------------------------------------------------------------

MAX_LINES = 500
SIZED = ("libs", "services", "sdk", "tools", "bench", "tests")
# Long modules being split right now, each with why it is exempt until that lands.
BEING_SPLIT: dict[str, str] = {}


def line_counts() -> dict[str, tuple[int, str]]:
    """Each module: its line count and its docstring."""
    found = {}
    for top in SIZED:
        for path in (ROOT / top).rglob("*.py"):
            if any(p.endswith(".egg-info") or p in ("build", ".venv") for p in path.parts):
                continue
            text = path.read_text()
            doc = ast.get_docstring(ast.parse(text)) or ""
            found[str(path.relative_to(ROOT))] = (len(text.splitlines()), doc)
    return found


def test_no_module_over_500_lines_without_a_reason_at_its_top() -> None:
    """A long module is usually two rooms: split it, or say at its top why it is one
    (``Long because: ...`` in its docstring)."""
    modules = line_counts()
    unexplained = {
        path: lines
        for path, (lines, doc) in modules.items()
        if lines > MAX_LINES
        and path not in BEING_SPLIT
        and not re.search(r"^Long because: \S", doc, re.MULTILINE)
    }
    assert not unexplained, f"split these, or say why they are long: {unexplained}"
    for path in BEING_SPLIT:
        lines, _ = modules.get(path, (0, ""))
        assert lines > MAX_LINES, f"{path} is split: drop it from BEING_SPLIT"


# --- a fresh install ------------------------------------------------------------------------


@pytest.mark.slow
def test_sdk_installs_without_the_runtime(tmp_path: Path) -> None:
    """``pip install swarm-sdk`` (with its contracts) in a new venv: the client and CLI work
    and none of the services' runtime came along. With uv where ``make setup`` installed it
    (the same resolution from the same metadata, in a second rather than a dozen)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    uv = Path(sys.executable).parent / "uv"
    installer = (
        [str(uv), "pip", "install", "--python", str(python)]
        if uv.exists()
        else [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
    )
    subprocess.run(
        [*installer, "-q", str(ROOT / "libs" / "common" / "contracts"), str(ROOT / "sdk")],
        check=True,
        timeout=600,
    )
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    installed = {line.split("==")[0].lower().replace("_", "-") for line in listed.splitlines()}
    assert {"swarm-sdk", "swarm-contracts", "httpx", "pydantic"} <= installed
    assert not installed & RUNTIME_DISTRIBUTIONS, installed & RUNTIME_DISTRIBUTIONS
    assert not {d for d in installed if d.startswith("opentelemetry")}
    check = "import swarm; from swarm.client import Client; from swarm.cli import app; print('ok')"
    out = subprocess.run(
        [str(python), "-c", check], check=True, capture_output=True, text=True, cwd=tmp_path
    )
    assert out.stdout.strip() == "ok"
    help_text = subprocess.run(
        [str(venv / "bin" / "swarm"), "--help"], check=True, capture_output=True, text=True
    ).stdout
    assert "submit" in help_text
