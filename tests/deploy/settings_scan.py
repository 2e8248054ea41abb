"""What settings each service reads, found in its source: every ``SWARM_*`` setting (the shared
ones and each service's own, ``swarm_<service>/settings.py``) and the reads of them in a
service's package and the runtime modules it imports (tests/deploy/test_k8s.py)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

from swarm_runtime.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SERVICES = sorted(p.parent.name for p in (ROOT / "services").glob("*/pyproject.toml"))

# Every setting: the shared ones and each service's own (swarm_<service>/settings.py).
FIELD_INFO = {
    name: info
    for module in ["swarm_runtime.settings"]
    + [f"swarm_{s}.settings" for s in SERVICES if importlib.util.find_spec(f"swarm_{s}.settings")]
    for cls in vars(importlib.import_module(module)).values()
    if isinstance(cls, type) and issubclass(cls, Settings)
    for name, info in cls.model_fields.items()
}
FIELDS = set(FIELD_INFO)
PACKAGE_ROOTS = {"swarm_runtime": ROOT / "libs" / "common" / "runtime" / "swarm_runtime"}


def module_file(module: str, roots: dict[str, Path]) -> Path | None:
    top, *rest = module.split(".")
    if top not in roots:
        return None
    path = roots[top].joinpath(*rest)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def settings_read_by(service: str) -> set[str]:
    """Settings fields read (``<...>settings.<field>``) in the service's package and in every
    swarm_runtime module it imports, transitively."""
    roots = {**PACKAGE_ROOTS, f"swarm_{service}": ROOT / "services" / service / f"swarm_{service}"}
    todo = list(roots[f"swarm_{service}"].glob("*.py"))
    seen: set[Path] = set()
    read: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            modules: list[str] = []
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            todo += [f for m in modules if (f := module_file(m, roots)) is not None]
            if isinstance(node, ast.Attribute) and node.attr in FIELDS:
                owner = node.value
                name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
                if "settings" in name.lower():
                    read.add(node.attr)
    return read


def single_machine_default(field: str) -> bool:
    """A default that only works with everything on one machine: a loopback address (another
    pod is never there) or a local directory store (not shared between pods)."""
    default = FIELD_INFO[field].default
    return isinstance(default, str) and (
        "127.0.0.1" in default or "localhost" in default or default.startswith("file://")
    )
