"""The lineage graph of an adapter version: its parents, base models and datasets."""

from __future__ import annotations

from swarm_contracts.registry import (
    AdapterVersion,
    GetAdapter,
    LineageEdge,
    LineageGraph,
    LineageNode,
)
from swarm_registry.adapters import AdapterCatalog, parse_ref
from swarm_registry.errors import RegistryError

# Continue-training chains are short; the bound only guards against a cycle in bad data.
MAX_DEPTH = 1000


def ref(record: AdapterVersion) -> str:
    return f"{record.name}@{record.version}"


def node(record: AdapterVersion) -> LineageNode:
    lin = record.lineage
    return LineageNode(
        ref=ref(record),
        tenant=record.tenant,
        job_id=lin.job_id,
        base_model=f"{lin.base_model}@{lin.base_model_version}",
        base_model_digest=lin.base_model_digest,
        dataset=lin.dataset,
        dataset_digest=lin.dataset_digest,
        validation_dataset=lin.validation_dataset,
        validation_digest=lin.validation_digest,
        parent=lin.parent,
        forked_from=lin.forked_from,
        metrics=lin.metrics,
        created_at=record.created_at,
    )


def edges(n: LineageNode) -> list[LineageEdge]:
    out = [
        LineageEdge(source=n.ref, target=n.base_model, kind="base_model"),
        LineageEdge(source=n.ref, target=n.dataset, kind="dataset"),
    ]
    if n.validation_dataset:
        out.append(LineageEdge(source=n.ref, target=n.validation_dataset, kind="validation"))
    if n.parent:
        out.append(LineageEdge(source=n.ref, target=n.parent, kind="parent"))
    if n.forked_from:
        # A job's checkpoint (JOB_ID@STEP), not an adapter: the chain of adapters ends here.
        out.append(LineageEdge(source=n.ref, target=n.forked_from, kind="checkpoint"))
    return out


async def lineage_graph(
    catalog: AdapterCatalog, name: str, version: int, tenant: str | None
) -> LineageGraph:
    """Follow ``lineage.parent`` up from ``name@version``; a parent that is deleted, or that
    belongs to another tenant when a tenant asks, ends the chain and is listed as unresolved
    (its existence is all another tenant learns)."""
    record = await catalog.get(
        GetAdapter(name=name, version=version, tenant=tenant, include_quarantined=True)
    )
    nodes = [node(record)]
    unresolved: list[str] = []
    seen = {nodes[0].ref}
    while (parent := nodes[-1].parent) is not None and len(nodes) < MAX_DEPTH:
        if parent in seen:
            break
        try:
            parent_name, parent_version, _ = parse_ref(parent)
            found = await catalog.get(
                GetAdapter(
                    name=parent_name,
                    version=parent_version,
                    tenant=tenant,
                    include_quarantined=True,
                )
            )
        except RegistryError:
            unresolved.append(parent)
            break
        seen.add(parent)
        nodes.append(node(found))
    return LineageGraph(
        root=nodes[0].ref,
        adapters=nodes,
        edges=[e for n in nodes for e in edges(n)],
        unresolved=unresolved,
    )
