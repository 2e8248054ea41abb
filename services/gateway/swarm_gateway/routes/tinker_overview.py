"""``/v1/tinker/overview``: the Tinker training sessions at a glance, for the dashboard's
"Training sessions" panel (docs/observability.md).

The calls' counts and times are read from this gateway's own Prometheus registry
(``swarm_gateway_tinker_calls_total``, ``swarm_gateway_tinker_call_seconds``): the one source,
so the panel and a scrape never disagree. That makes them what the registry can say: counted
since this gateway started, of the calls it settled, and the quantiles known only to the
histogram's bucket (an upper bound, never an invented figure); the means are exact. The
models still held by a worker come from the ``tinker_models`` bucket, through a watch
(``RecordCache``), so the page's polling reads memory, not the bucket key by key.

A tenant sees its own calls and models; an admin every tenant's, or one (``tenant``), as for
``/v1/jobs``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal, get_args, get_origin

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from swarm_gateway.auth import Caller
from swarm_gateway.prometheus import TINKER_PARTS, GatewayMetrics
from swarm_gateway.routes.tinker import T
from swarm_gateway.tinker.records import FutureRecord, ModelRecord

router = APIRouter(prefix="/v1/tinker", tags=["tinker"])

# A model a worker holds, or is building: what "open" means here (closed and failed ones are
# gone from their worker).
HELD_STATES = frozenset({"creating", "ready"})
# The p50 and p90 of PartTiming.
QUANTILES = (0.5, 0.9)


def _literals(annotation: Any) -> list[str]:
    """The values of a ``Literal`` or a union of them, in the order they are written."""
    if get_origin(annotation) is Literal:
        return [str(v) for v in get_args(annotation)]
    return [v for arg in get_args(annotation) for v in _literals(arg)]


# In the order of the contract (a training loop's order, roughly), not a list of our own.
OPS = _literals(FutureRecord.model_fields["op"].annotation)
# A future's states but the one it starts in: those a settled call is counted under.
SETTLED = [
    s
    for s in _literals(FutureRecord.model_fields["state"].annotation)
    if s != FutureRecord.model_fields["state"].default
]


class PartTiming(BaseModel):
    count: int = Field(description="calls timed (done ones: a failed call has no compute time)")
    mean_s: float
    p50_le_s: float | None = Field(
        description="the histogram bucket the median falls in, as its upper bound; "
        "None: beyond the last bound"
    )
    p90_le_s: float | None = Field(description="the same for the 90th percentile")


class OpCalls(BaseModel):
    op: str
    calls: dict[str, int] = Field(description="settled calls by state (done, failed)")
    timing: dict[str, PartTiming] = Field(description="by part: total, compute, queue")


class HeldModel(BaseModel):
    model_id: str
    session_id: str
    tenant: str
    base_model: str = Field(description="as the client named it")
    rank: int
    state: str
    worker_id: str
    created_at: datetime
    last_save: str | None = Field(default=None, description="its latest save_state's path")
    last_save_step: int | None = None
    restored: str | None = None


class TinkerOverview(BaseModel):
    since: datetime = Field(description="when this gateway began counting (it started)")
    states: list[str] = Field(description="the states calls are counted under, in order")
    parts: list[str] = Field(description="the parts each call's time is split into, in order")
    ops: list[OpCalls] = Field(description="each op called since, in the contract's order")
    sessions: int = Field(description="sessions with a model held by a worker")
    models: list[HeldModel] = Field(description="models held by a worker, newest first")


def _quantile_le(buckets: dict[float, float], count: float, q: float) -> float | None:
    """The upper bound of the bucket holding the ``q`` quantile (cumulative ``le`` counts)."""
    rank = q * count
    for le in sorted(buckets):
        if buckets[le] >= rank:
            return None if math.isinf(le) else le
    return None


Ours = Callable[[dict[str, str]], bool]


def _counts(metrics: GatewayMetrics, ours: Ours) -> dict[str, dict[str, int]]:
    """op -> state -> settled calls."""
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    for family in metrics.tinker_calls.collect():
        for s in family.samples:
            if s.name.endswith("_total") and ours(s.labels):
                by_state = counts[s.labels["op"]]
                by_state[s.labels["state"]] = by_state.get(s.labels["state"], 0) + int(s.value)
    return counts


def _timings(metrics: GatewayMetrics, ours: Ours) -> dict[tuple[str, str], PartTiming]:
    """(op, part) -> its timing, from the histogram's cumulative buckets, sums and counts."""
    buckets: dict[tuple[str, str], dict[float, float]] = defaultdict(lambda: defaultdict(float))
    sums: dict[tuple[str, str], float] = defaultdict(float)
    timed: dict[tuple[str, str], float] = defaultdict(float)
    for family in metrics.tinker_call.collect():
        for s in family.samples:
            if not ours(s.labels):
                continue
            key = (s.labels["op"], s.labels["part"])
            if s.name.endswith("_bucket"):
                buckets[key][float(s.labels["le"])] += s.value
            elif s.name.endswith("_sum"):
                sums[key] += s.value
            elif s.name.endswith("_count"):
                timed[key] += s.value
    timings = {}
    for key, n in timed.items():
        if n:
            p50, p90 = (_quantile_le(buckets[key], n, q) for q in QUANTILES)
            timings[key] = PartTiming(
                count=int(n), mean_s=sums[key] / n, p50_le_s=p50, p90_le_s=p90
            )
    return timings


def call_stats(metrics: GatewayMetrics, tenant: str | None) -> list[OpCalls]:
    """Per op, from the registry's samples; ``tenant`` None: every tenant's, summed."""

    def ours(labels: dict[str, str]) -> bool:
        return tenant is None or labels["tenant"] == tenant

    counts, timings = _counts(metrics, ours), _timings(metrics, ours)
    known = {op: i for i, op in enumerate(OPS)}
    return [
        OpCalls(
            op=op,
            calls={state: counts[op].get(state, 0) for state in SETTLED},
            timing={p: timings[(op, p)] for p in TINKER_PARTS if (op, p) in timings},
        )
        for op in sorted(counts, key=lambda op: (known.get(op, len(known)), op))
    ]


def held_model(m: ModelRecord) -> HeldModel:
    saved = m.last_state
    return HeldModel(
        model_id=m.model_id,
        session_id=m.session_id,
        tenant=m.tenant,
        base_model=m.base_model_name,
        rank=m.rank,
        state=m.state,
        worker_id=m.worker_id,
        created_at=m.created_at,
        last_save=saved.path if saved else None,
        last_save_step=saved.step if saved else None,
        restored=m.restored,
    )


@router.get("/overview", response_model=TinkerOverview)
async def tinker_overview(
    request: Request,
    t: T,
    caller: Caller,
    tenant: Annotated[str | None, Query(description="admins only: one tenant's")] = None,
) -> TinkerOverview:
    """The caller's Tinker calls (counts, queue and compute time, per op) since this gateway
    started, and its models a worker holds; an admin sees every tenant's (or one, with
    ``tenant``)."""
    if not caller.admin:
        tenant = caller.tenant
    metrics: GatewayMetrics = request.app.state.metrics
    held = [
        m
        for m in await t.model_list.all()
        if m.state in HELD_STATES and (tenant is None or m.tenant == tenant)
    ]
    held.sort(key=lambda m: m.created_at, reverse=True)
    return TinkerOverview(
        since=metrics.started,
        states=SETTLED,
        parts=list(TINKER_PARTS),
        ops=call_stats(metrics, tenant),
        sessions=len({m.session_id for m in held}),
        models=[held_model(m) for m in held],
    )
