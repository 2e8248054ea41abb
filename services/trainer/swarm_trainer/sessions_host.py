"""The training sessions this worker holds (swarm_trainer.session), and their calls in order.

Calls arrive on ``swarm.workers.<this worker>.sessions.<session>`` (request/reply from the
gateway). The subscriber takes one message at a time, so a session's calls run in the order the
gateway sent them, which is the SDK's ``seq_id`` order (the SDK sends a session's next call only
once the gateway has accepted the previous one); a call whose ``seq_id`` is not above the last
one run is refused rather than run out of order (ids may skip: a call the gateway refused never
arrives). A session no call touched for ``session_idle_s`` is
closed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from swarm_contracts.sessions import SessionCall, SessionResult
from swarm_runtime.rpc import Refused
from swarm_runtime.store import ObjectStore
from swarm_trainer.cache import TransferCache

log = logging.getLogger(__name__)


@dataclass
class Held:
    tenant: str
    session: object  # a swarm_trainer.session.TrainingSession (torch: imported on first use)
    last_seq: int = 0
    last_used: float = field(default_factory=time.monotonic)


class SessionHost:
    def __init__(self, store: ObjectStore | None, cache: TransferCache, idle_s: float) -> None:
        self.store = store
        self.cache = cache
        self.idle_s = idle_s
        self.held: dict[str, Held] = {}

    async def call(self, call: SessionCall) -> SessionResult:
        self.close_idle()
        if call.op == "create":
            return await self._create(call)
        held = self.held.get(call.session)
        if held is None or held.tenant != call.tenant:
            raise Refused(f"no training session {call.session} on this worker", "not_found")
        if call.op == "close":
            del self.held[call.session]
            return SessionResult()
        if call.seq_id <= held.last_seq:
            raise Refused(f"seq_id: {call.seq_id} out of order, after {held.last_seq}")
        held.last_seq = call.seq_id
        held.last_used = started = time.monotonic()
        result = await asyncio.to_thread(self._run, held, call)
        result.compute_s = time.monotonic() - started
        return result

    def close_idle(self) -> None:
        now = time.monotonic()
        for token, held in list(self.held.items()):
            if now - held.last_used > self.idle_s:
                log.info("training session %s idle for %.0f s: closed", token, self.idle_s)
                del self.held[token]

    async def _create(self, call: SessionCall) -> SessionResult:
        if call.create is None:
            raise Refused("create: no model")
        if call.session in self.held:
            return self.held[call.session].session.info()  # type: ignore[attr-defined]
        store = self._store()
        spec = call.create

        def build() -> object:
            from swarm_trainer import fetch
            from swarm_trainer.session import TrainingSession

            with fetch.base_model(self.cache, store, spec.base_model) as entry:
                session = TrainingSession(spec, entry.path)
            if spec.load_key is not None:
                session.load(store, spec.load_key, optimizer=spec.load_optimizer)
            return session

        started = time.monotonic()
        session = await asyncio.to_thread(build)
        self.held[call.session] = Held(call.tenant, session)
        log.info("training session %s (%s) opened", call.session, spec.base_model.name)
        result: SessionResult = session.info()  # type: ignore[attr-defined]
        result.compute_s = time.monotonic() - started
        return result

    def _store(self) -> ObjectStore:
        if self.store is None:
            # A worker without store keys is granted its store operations per job attempt; a
            # session is no job (yet): docs/tinker.md, "What is left".
            raise Refused("this worker holds no store keys: it cannot hold training sessions")
        return self.store

    def _run(self, held: Held, call: SessionCall) -> SessionResult:
        from swarm_trainer.session import TrainingSession

        session = held.session
        assert isinstance(session, TrainingSession)
        if call.op in ("forward", "forward_backward"):
            return session.forward(
                call.data,
                call.loss_fn or "",
                call.loss_fn_config,
                backward=call.op == "forward_backward",
            )
        if call.op == "optim_step":
            if call.adam is None:
                raise Refused("adam_params: missing")
            return session.optim_step(call.adam)
        if call.store_key is None:
            raise Refused(f"{call.op}: no path")
        if call.op == "load_state":
            return session.load(self._store(), call.store_key, optimizer=call.optimizer)
        # save_state keeps the optimizer; save_weights_for_sampler only the adapter.
        return session.save(self._store(), call.store_key, optimizer=call.op == "save_state")
