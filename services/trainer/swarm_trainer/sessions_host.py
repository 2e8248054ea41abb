"""The training sessions this worker holds (swarm_trainer.session), and their calls in order.

Calls arrive on ``swarm.workers.<this worker>.sessions.<session>`` (request/reply from the
gateway). The subscriber takes one message at a time, so a session's calls run in the order the
gateway sent them, which is the SDK's ``seq_id`` order (the SDK sends a session's next call only
once the gateway has accepted the previous one); a call whose ``seq_id`` is not above the last
one run is refused rather than run out of order (ids may skip: a call the gateway refused never
arrives). A session no call touched for ``session_idle_s`` is
closed.

Each session is held under the scheduler's lease (swarm_scheduler.session_leases): the worker
lists what it holds in its heartbeats (``listed``), which keeps the leases; a call of another
attempt than the one held is refused, and before a save writes to the store the worker asks
the scheduler whether it still holds that attempt (``holds``): a worker frozen while its
session moved on cannot overwrite what the session's new worker saves. A worker holding no
store keys (a provider's) reads and writes with what the registry grants the attempt (the
create call brings its token), as for a job: its tenant's saves, its own, its base model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from swarm_contracts.sessions import HeldSession, SessionCall, SessionResult
from swarm_runtime.rpc import Refused
from swarm_runtime.store import ObjectStore
from swarm_trainer.cache import TransferCache
from swarm_trainer.session_lane import GpuLane
from swarm_trainer.signed_store import StoreAccessRefused

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _granted(call: SessionCall) -> Iterator[None]:
    """A store operation the registry refused the attempt (its lease ended, or a key outside
    its scope) refuses the call, saying so: the worker's refusal, not an internal error."""
    try:
        yield
    except StoreAccessRefused as exc:
        raise Refused(f"{call.op}: {exc.message}", "forbidden") from exc


@dataclass
class Held:
    tenant: str
    session: object  # a swarm_trainer.session.TrainingSession (torch: imported on first use)
    attempt: int
    store: ObjectStore
    last_seq: int = 0
    last_used: float = field(default_factory=time.monotonic)
    # The last calls' outcomes by seq_id, for ``answer_again``.
    answers: dict[int, SessionResult | Refused] = field(default_factory=dict)

    def answered(self, seq_id: int, outcome: SessionResult | Refused) -> None:
        self.answers[seq_id] = outcome
        for old in sorted(self.answers)[:-ANSWERS_KEPT]:
            del self.answers[old]


# Whether this worker still holds attempt ``n`` of a session's lease (asked of the scheduler).
Holds = Callable[[str, int], Awaitable[bool]]
# A store for one attempt of a session, granted operation by operation by the registry (a
# worker without store keys: swarm_trainer.signed_store), from the session, attempt and token.
Signed = Callable[[str, int, str], ObjectStore]
SAVES = ("save_state", "save_weights_for_sampler")
# How many of a session's last answers are kept for a gateway that asks again: a dead
# gateway's unheard calls are the last few the SDK sent. Kept as they are (serializing them
# again would cost every call CPU); a large forward's answer holds a float per token.
ANSWERS_KEPT = 8


class SessionHost:
    def __init__(
        self,
        store: ObjectStore | None,
        cache: TransferCache,
        idle_s: float,
        holds: Holds | None = None,
        signed: Signed | None = None,
        lane: GpuLane | None = None,
    ) -> None:
        self.store = store
        self.cache = cache
        self.idle_s = idle_s
        self.holds = holds
        self.signed = signed
        # On a machine with GPUs: the one the sessions run on, held in the agent's Ray.
        self.lane = lane
        self.held: dict[str, Held] = {}
        self.building: dict[str, int] = {}  # session -> attempt, while its model is built

    def listed(self) -> list[HeldSession]:
        """What the heartbeats list: the sessions held and being built, with their attempts."""
        held = [HeldSession(session=t, attempt=h.attempt) for t, h in self.held.items()]
        return held + [HeldSession(session=t, attempt=a) for t, a in self.building.items()]

    async def call(self, call: SessionCall) -> SessionResult:
        self.close_idle()
        if call.op == "create":
            return await self._create(call)
        held = self.held.get(call.session)
        if held is None or held.tenant != call.tenant:
            raise Refused(f"no training session {call.session} on this worker", "not_found")
        if call.attempt != held.attempt:
            raise Refused(
                f"attempt {call.attempt} of session {call.session} is not this worker's (it "
                f"holds attempt {held.attempt})",
                "forbidden",
            )
        if call.op == "close":
            self._drop(call.session)
            return SessionResult()
        if call.op == "answer_again":
            return self._answer_again(held, call.seq_id)
        if call.seq_id <= held.last_seq:
            raise Refused(f"seq_id: {call.seq_id} out of order, after {held.last_seq}")
        held.last_seq = call.seq_id
        holds = self.holds
        if call.op in SAVES and holds is not None and not await holds(call.session, held.attempt):
            self._drop(call.session)  # moved on without this worker: let it go
            raise Refused(
                f"this worker no longer holds attempt {held.attempt} of session "
                f"{call.session}: nothing saved",
                "forbidden",
            )
        held.last_used = started = time.monotonic()
        try:
            with _granted(call):
                result = await asyncio.to_thread(self._run, held, call)
        except Refused as exc:
            held.answered(call.seq_id, exc)
            raise
        result.compute_s = time.monotonic() - started
        held.answered(call.seq_id, result)
        return result

    @staticmethod
    def _answer_again(held: Held, seq_id: int) -> SessionResult:
        """A call's answer once more (its gateway died before it heard it). Calls run one at a
        time in arrival order, so a call still running when this arrives has answered by now."""
        if seq_id == 0:  # the create: the model is built, or this would not be held
            return held.session.info()  # type: ignore[attr-defined]
        outcome = held.answers.get(seq_id)
        if outcome is None:
            raise Refused(
                f"seq_id {seq_id}: this worker keeps no answer to it (it never arrived, or was "
                "answered long ago): it may not have run",
                "internal",
            )
        if isinstance(outcome, Refused):
            raise outcome
        return outcome

    def close_idle(self) -> None:
        now = time.monotonic()
        for token, held in list(self.held.items()):
            if now - held.last_used > self.idle_s:
                log.info("training session %s idle for %.0f s: closed", token, self.idle_s)
                self._drop(token)

    async def _create(self, call: SessionCall) -> SessionResult:
        if call.create is None:
            raise Refused("create: no model")
        if (same := self.held.get(call.session)) is not None and same.attempt == call.attempt:
            return same.session.info()  # type: ignore[attr-defined]
        store = self._store(call)
        spec = call.create

        def build() -> object:
            import torch

            from swarm_trainer import fetch
            from swarm_trainer.session import TrainingSession

            lane = self.lane if torch.cuda.is_available() else None
            device = lane.device() if lane is not None else None
            with fetch.base_model(self.cache, store, spec.base_model) as entry:
                session = TrainingSession(spec, entry.path, device)
            if spec.load_key is not None:
                session.load(store, spec.load_key, optimizer=spec.load_optimizer)
            return session

        started = time.monotonic()
        self.building[call.session] = call.attempt
        try:
            with _granted(call):
                session = await asyncio.to_thread(build)
        except BaseException:
            self.building.pop(call.session, None)
            self._release_lane()
            raise
        self.building.pop(call.session, None)
        # An older attempt held here (the session came back to this worker) is replaced.
        self.held[call.session] = Held(call.tenant, session, call.attempt, store)
        log.info("training session %s (%s) opened", call.session, spec.base_model.name)
        result: SessionResult = session.info()  # type: ignore[attr-defined]
        result.compute_s = time.monotonic() - started
        return result

    def _drop(self, token: str) -> None:
        del self.held[token]
        self._release_lane()

    def _release_lane(self) -> None:
        """No session held or being built: the lane's GPU goes back to Ray's jobs."""
        if self.lane is not None and not self.held and not self.building:
            self.lane.release()

    def _store(self, call: SessionCall) -> ObjectStore:
        """The store as this session's attempt may use it: this worker's own, or (holding no
        store keys) what the registry grants the attempt, operation by operation."""
        if self.store is not None:
            return self.store
        if self.signed is None or not call.attempt_token:
            raise Refused("this worker holds no store keys, and the call no attempt token")
        return self.signed(call.session, call.attempt, call.attempt_token)

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
            return session.load(held.store, call.store_key, optimizer=call.optimizer)
        # save_state keeps the optimizer; save_weights_for_sampler only the adapter.
        return session.save(held.store, call.store_key, optimizer=call.op == "save_state")
