"""What a settled call does before anyone reads it settled, from what its future records
(``FutureRecord.follow_up``): whichever gateway hears the worker's answer does it, the one that
sent the call or one that adopted the future when that one died (tinker.sessions.adopt).

``built``: the model is ready (with its context length), or failed. ``saved``: a
``save_state`` is the model's latest state, what a restore starts from. ``registered``: the
weights saved for sampling are a version of adapter ``<session>-train-<n>`` in the registry,
named in the model's record (what sampling clients of ``tinker://<model>/sampler_weights/<name>``
sample from), and, with a sampler id, that sampling session too
(``save_weights_and_get_sampling_client``).
"""

from __future__ import annotations

from collections.abc import Callable

from swarm_contracts.jobs import LoraSpec, TrainingSpec
from swarm_contracts.registry import Lineage, RegisterAdapter
from swarm_contracts.registry_api import REGISTER_ADAPTER
from swarm_gateway.tinker.records import (
    FollowUp,
    FutureRecord,
    ModelRecord,
    SamplerRecord,
    SavedState,
    model_token,
)
from swarm_runtime.records import RecordTable
from swarm_runtime.rpc import ServiceClient


class FollowUps:
    """The follow-ups' effects on the gateway's records (and the registry)."""

    def __init__(
        self,
        models: RecordTable[ModelRecord],
        samplers: RecordTable[SamplerRecord],
        registry: ServiceClient | None = None,
    ) -> None:
        self.models = models
        self.samplers = samplers
        self.registry = registry

    async def __call__(self, future: FutureRecord) -> FutureRecord:
        """The future as it is to be kept (a registration that failed fails it)."""
        follow = future.follow_up
        if follow is None:
            return future
        if follow.kind == "built":
            await self._built(future)
        elif future.state == "done" and future.result is not None:
            if follow.kind == "saved":
                await self._saved(future, follow)
            else:
                future = await self._registered(future, follow)
        return future

    async def _change_model(self, model_id: str, change: Callable[[ModelRecord], None]) -> None:
        def changed(r: ModelRecord) -> ModelRecord:
            change(r)
            return r

        await self.models.modify(model_token(model_id), changed)

    async def _built(self, future: FutureRecord) -> None:
        def settle(r: ModelRecord) -> None:
            if future.state == "done" and future.result is not None:
                context = future.result.model_info.get("max_context")
                r.max_context = context if isinstance(context, int) else None
                r.state = "ready"
            else:
                r.state, r.error = "failed", future.error

        await self._change_model(future.model_id, settle)

    async def _saved(self, future: FutureRecord, follow: FollowUp) -> None:
        assert future.result is not None
        assert future.path is not None
        assert follow.store_key is not None
        state = SavedState(path=future.path, store_key=follow.store_key, step=future.result.step)

        def latest(r: ModelRecord) -> None:
            r.last_state = state

        await self._change_model(future.model_id, latest)

    async def _registered(self, future: FutureRecord, follow: FollowUp) -> FutureRecord:
        assert future.result is not None
        assert follow.store_key is not None
        assert follow.job_id is not None
        assert follow.name is not None
        assert self.registry is not None
        found = await self.models.get(model_token(future.model_id))
        if found is None:
            raise LookupError(f"no training model {future.model_id}")
        record, base = found[0], found[0].base_model
        lineage = Lineage(
            tenant=record.tenant,
            job_id=follow.job_id,
            attempt=1,
            base_model=base.name,
            base_model_version=base.version,
            base_model_digest=base.digest or "",
            dataset=f"tinker:{record.model_id}",
            dataset_digest="",
            lora=LoraSpec(
                r=record.rank,
                alpha=float(record.rank),
                dropout=0.0,
                target_modules=record.target_modules or ["q_proj", "v_proj"],
            ),
            training=TrainingSpec(max_steps=max(1, future.result.step)),
            metrics={"step": float(future.result.step)},
            worker_id=future.worker_id or record.worker_id,
        )
        request = RegisterAdapter(
            name=model_token(record.model_id), store_key=follow.store_key, lineage=lineage
        )
        version = await self.registry.call(REGISTER_ADAPTER, request)
        ref, name = f"{version.name}@{version.version}", follow.name

        def remember(r: ModelRecord) -> None:
            r.samplers[name] = ref

        await self._change_model(record.model_id, remember)
        future.adapter = ref
        if follow.sampler_id is not None:
            sampler = SamplerRecord.of_weights(record, ref, future.path, follow.sampler_id)
            await self.samplers.put(model_token(follow.sampler_id), sampler)
            future.sampling_session_id = follow.sampler_id
        return future
