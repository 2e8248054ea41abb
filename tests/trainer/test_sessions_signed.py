"""A training session on a worker holding no store keys (a provider's): its base model, its
saves and its sampler saves go through the registry's grants for the session's lease, against
a real S3 server and a real registry (docs/tinker.md, *Placement*)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from swarm_contracts.jobs import ModelRef
from swarm_contracts.sessions import (
    AdamStep,
    CreateSession,
    SessionCall,
    SessionDatum,
    SessionLease,
)
from swarm_contracts.subjects import Subjects
from swarm_registry.app import build_app as build_registry
from swarm_runtime.records import RecordTable
from swarm_runtime.rpc import Refused
from swarm_runtime.settings import Settings
from swarm_runtime.store import ObjectStore, S3Store, open_store
from swarm_runtime.topology import ensure_topology, kv_bucket
from swarm_trainer.cache import TransferCache
from swarm_trainer.sessions_host import SessionHost
from swarm_trainer.signed_store import SignedAccess, SignedStore

from ..conftest import S3Server
from ..registry.test_store_access import SESSION, held_lease, s3_settings
from .conftest import put_model

TOKEN = "the-lease-attempts-token"


class Stack:
    def __init__(self, store: S3Store, base: ModelRef, leases: RecordTable[SessionLease]):
        self.store, self.base, self.leases = store, base, leases


@pytest.fixture
async def stack(
    settings: Settings, s3_server: S3Server, tiny_model_dir: Path
) -> AsyncIterator[Stack]:
    """The registry with the store's keys, the tiny model in the store, and the session's
    lease (attempt 2, on worker w-p) as the scheduler writes it."""
    cluster = s3_settings(settings, s3_server)
    store = open_store(cluster)
    assert isinstance(store, S3Store)
    base = put_model(store, tiny_model_dir)
    nc = await nats.connect(settings.nats_url)
    registry = build_registry(cluster)
    try:
        s = Subjects(settings.namespace)
        await ensure_topology(nc.jetstream(), s)
        leases = RecordTable(await kv_bucket(nc.jetstream(), s, "session_leases"), SessionLease)
        await leases.put(SESSION, held_lease("w-p", base, TOKEN))
        await registry.start()
        yield Stack(store, base, leases)
    finally:
        await registry.stop()
        await nc.close()


def _call(seq_id: int, op: str, **fields: object) -> SessionCall:
    return SessionCall.model_validate(
        {"session": SESSION, "tenant": "acme", "seq_id": seq_id, "attempt": 2, "op": op} | fields
    )


DATA = [
    SessionDatum(
        tokens=[3, 4, 5, 6],
        inputs={"target_tokens": [4.0, 5.0, 6.0, 7.0], "weights": [1.0, 1.0, 1.0, 1.0]},
    )
]


async def test_a_session_on_a_worker_without_store_keys_trains_and_saves_by_grants(
    stack: Stack, settings: Settings, tmp_path: Path
) -> None:
    made: list[SignedStore] = []

    def signed(session: str, attempt: int, token: str) -> ObjectStore:
        made.append(SignedStore(SignedAccess.of_attempt(settings, session, attempt, token, "w-p")))
        return made[-1]

    host = SessionHost(None, TransferCache(tmp_path / "cache", 1 << 30), 600, signed=signed)
    create = CreateSession(base_model=stack.base, rank=2, seed=0)

    # Without the token the worker has nothing to ask with: refused, nothing held.
    with pytest.raises(Refused, match="no attempt token"):
        await host.call(_call(0, "create", create=create))
    info = await host.call(_call(0, "create", create=create, attempt_token=TOKEN))
    assert info.model_info["max_context"]
    assert made[0].url == f"signed:{SESSION}/2"

    fb = await host.call(_call(1, "forward_backward", data=DATA, loss_fn="cross_entropy"))
    assert fb.metrics["loss:sum"] > 0
    await host.call(_call(2, "optim_step", adam=AdamStep(learning_rate=1e-2)))
    state = f"tinker/acme/{SESSION}/state/step-000002"
    saved = await host.call(_call(3, "save_state", store_key=state))
    assert saved.files
    assert all(stack.store.exists(f"{state}/{f}") for f in saved.files)
    sampler = f"outputs/{SESSION}-s4/1"
    weights = await host.call(_call(4, "save_weights_for_sampler", store_key=sampler))
    assert weights.files
    assert all(stack.store.exists(f"{sampler}/{f}") for f in weights.files)

    # Outside the lease's scope: another tenant's saves. The call fails, the session stays.
    theirs = f"tinker/other/{SESSION}/state/x"
    with pytest.raises(Refused, match="outside session"):
        await host.call(_call(5, "save_state", store_key=theirs))
    assert not stack.store.list_sized(theirs + "/")
    before = await host.call(_call(6, "forward", data=DATA, loss_fn="cross_entropy"))
    loaded = await host.call(_call(7, "load_state", store_key=state))
    assert loaded.step == 1
    after = await host.call(_call(8, "forward", data=DATA, loss_fn="cross_entropy"))
    assert after.outputs == before.outputs  # the save was of this very state

    # The lease ends (the session moved on): the grants stop with it.
    found = await stack.leases.get(SESSION)
    assert found is not None
    await stack.leases.put(SESSION, found[0].model_copy(update={"state": "ended"}))
    with pytest.raises(Refused, match="stale attempt"):
        await host.call(_call(9, "save_state", store_key=f"{state}-late"))
