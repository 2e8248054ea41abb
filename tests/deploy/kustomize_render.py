"""Render deploy/k8s's kustomization without kubectl: the subset of kustomize it uses.

Supported: ``resources`` (files, or directories with their own kustomization), ``namespace``
and ``configMapGenerator`` (files and literals, with ``disableNameSuffixHash``). Any other
field is an error, so that the manifests cannot use a kustomize feature this renderer would
silently ignore (and the tests then check something other than what `kubectl apply -k` sends).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "configMapGenerator"}
# Kinds without a namespace (among those the manifests may hold).
CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "StorageClass",
}


class KustomizeError(Exception):
    pass


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize directory` would print, in order."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED
    if unknown:
        raise KustomizeError(f"{directory}: kustomization fields not rendered here: {unknown}")
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources") or []:
        path = (directory / entry).resolve()
        if not path.is_relative_to(directory.resolve()):
            raise KustomizeError(f"{entry}: outside the kustomization's root")
        if path.is_dir():
            objects += render(path)
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for generator in kustomization.get("configMapGenerator") or []:
        objects.append(config_map(directory, generator))
    namespace = kustomization.get("namespace")
    if namespace:
        for obj in objects:
            if obj.get("kind") not in CLUSTER_SCOPED:
                obj.setdefault("metadata", {})["namespace"] = namespace
    return objects


def config_map(directory: Path, generator: dict[str, Any]) -> dict[str, Any]:
    if not (generator.get("options") or {}).get("disableNameSuffixHash"):
        # kustomize would add a content hash to the name, which this renderer does not.
        raise KustomizeError(f"configMapGenerator {generator['name']}: set disableNameSuffixHash")
    unknown = set(generator) - {"name", "files", "literals", "options"}
    if unknown:
        raise KustomizeError(f"configMapGenerator {generator['name']}: {unknown} not rendered")
    data: dict[str, str] = {}
    for entry in generator.get("files") or []:
        key, _, source = entry.rpartition("=")
        path = directory / source
        data[key or path.name] = path.read_text()
    for literal in generator.get("literals") or []:
        key, _, value = literal.partition("=")
        data[key] = value
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": generator["name"]},
        "data": data,
    }
