"""A Tinker training session outlives the worker that holds it: kill -9 that worker and the
session is built again on the other one from its latest save_state, the call that was lost
says so (and from which step training resumes), and the loop goes on (docs/tinker.md). It
outlives its gateway too: a call in flight when the gateway dies is answered through the next."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time

import nats
import pytest
import tinker
from tinker import types

from swarm_contracts.subjects import Subjects

from ..tinker_data import datum, logprobs
from .conftest import Procs, start_base

pytestmark = pytest.mark.slow


def _step(client: tinker.TrainingClient) -> None:
    client.forward_backward([datum()], "cross_entropy").result(timeout=120)
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=120)


def _holder(procs: Procs, model_id: str) -> str:
    """The worker the gateway's record says holds the model (the tinker_models bucket)."""

    async def read() -> str:
        nc = await nats.connect(procs.nats.url)
        try:
            kv = await nc.jetstream().key_value(Subjects(procs.namespace).bucket("tinker_models"))
            entry = await kv.get(model_id.replace(":", "-"))
            assert entry.value is not None
            worker: str = json.loads(entry.value)["worker_id"]
            return worker
        finally:
            await nc.close()

    return asyncio.run(read())


def _placed(procs: Procs) -> str:
    """The worker the (only) model was placed on, once it is placed."""

    async def read() -> str:
        nc = await nats.connect(procs.nats.url)
        try:
            kv = await nc.jetstream().key_value(Subjects(procs.namespace).bucket("tinker_models"))
            for _ in range(1000):
                with contextlib.suppress(nats.js.errors.NoKeysError):
                    for key in await kv.keys():
                        entry = await kv.get(key)
                        worker = json.loads(entry.value or b"{}").get("worker_id")
                        if worker:
                            return str(worker)
                await asyncio.sleep(0.02)
            raise AssertionError("the model was never placed")
        finally:
            await nc.close()

    return asyncio.run(read())


def _workers(procs: Procs) -> tinker.ServiceClient:
    """Two trainers, and a client of the stack. The scheduler gives a silent worker up after
    10 s: the gateway's death is staged with the worker frozen a moment (its call waiting at
    it), which a loaded machine may stretch past the fault tests' usual 3 s."""
    start_base(procs, SWARM_WORKER_TIMEOUT_S="10")
    for name in ("t1", "t2"):
        procs.start(name, "trainer", SWARM_WORKER_ID=name)
    for name in ("t1", "t2"):
        procs.wait_worker(name, lambda w: w["state"] == "alive", timeout=180)
    return tinker.ServiceClient(
        base_url=f"http://127.0.0.1:{procs.gateway_port}", api_key="tml-local"
    )


def _session(procs: Procs) -> tuple[tinker.ServiceClient, tinker.TrainingClient]:
    """Two trainers, and a training client on one of them."""
    service = _workers(procs)
    training = service.create_lora_training_client(base_model="tiny", rank=4, seed=0).result(
        timeout=180
    )
    return service, training


def test_a_session_outlives_a_killed_worker_and_a_killed_gateway(
    procs: Procs,
) -> None:
    service, training = _session(procs)
    for _ in range(2):
        _step(training)
    saved = training.save_state("two").result(timeout=120).path
    at_two = logprobs(training)
    _step(training)  # a step past the save: lost with the worker
    assert logprobs(training) != at_two

    holder = _holder(procs, training.model_id)
    other = "t2" if holder == "t1" else "t1"
    procs.kill(holder)

    # The first call after the loss fails, saying what happened and where training resumes.
    started = time.monotonic()
    with pytest.raises(tinker.RequestFailedError) as lost:
        logprobs(training)
    message = str(lost.value)
    assert f"worker {holder} holding this session was lost" in message, message
    assert f"restored on worker {other} from save_state {saved} (step 2)" in message, message
    assert time.monotonic() - started < 60, "the loss was noticed late"
    assert _holder(procs, training.model_id) == other

    # The session goes on there, from the saved state, optimizer and all.
    assert logprobs(training) == pytest.approx(at_two, abs=1e-6)
    _step(training)
    assert logprobs(training) != pytest.approx(at_two, abs=1e-6)

    # The gateway dies with a call in flight (a rolling restart): the worker's answer goes to
    # the dead gateway's inbox; the next gateway adopts the future and asks for it again.
    procs.kill(other, signal.SIGSTOP)  # the call waits at the worker while the gateway dies
    try:
        in_flight = training.forward_backward([datum()], "cross_entropy")
        _wait_pending(procs, "forward_backward")
        procs.kill("gateway")
    finally:
        procs.kill(other, signal.SIGCONT)
    procs.start("gateway2", "gateway")  # on the same port, a new inbox
    assert in_flight.result(timeout=120).loss_fn_outputs
    assert "adopted from the dead gateway" in (procs.root / "logs" / "gateway2.log").read_text()
    _step(training)
    service.close("success").result(timeout=60)  # no heartbeats left behind


def _wait_pending(procs: Procs, op: str) -> None:
    """Until a call ``op`` is pending in the futures bucket (sent to its worker)."""

    async def wait() -> None:
        nc = await nats.connect(procs.nats.url)
        try:
            bucket = Subjects(procs.namespace).bucket("tinker_futures")
            kv = await nc.jetstream().key_value(bucket)
            for _ in range(500):
                for key in await kv.keys():
                    entry = await kv.get(key)
                    future = json.loads(entry.value or b"{}")
                    if future.get("op") == op and future.get("state") == "pending":
                        return
                await asyncio.sleep(0.02)
            raise AssertionError(f"no {op} call was ever pending")
        finally:
            await nc.close()

    asyncio.run(wait())


def test_a_frozen_workers_create_moves_and_a_call_in_flight_fails_once_it_is_lost(
    procs: Procs,
) -> None:
    """A frozen worker still holds its subscription (no "no responders"): its calls are
    pending until the scheduler gives it up. A ``create`` then moves to another worker, waiting
    for one if none is free (nothing was built: the client is not told); a later call fails,
    and the model is restored."""
    # The scheduler gives a silent worker up after 8 s: time enough, however loaded the
    # machine, to place a create on t1 after it froze.
    start_base(procs, SWARM_WORKER_TIMEOUT_S="8")
    procs.start("t1", "trainer", SWARM_WORKER_ID="t1")
    procs.wait_worker("t1", lambda w: w["state"] == "alive", timeout=180)
    service = tinker.ServiceClient(
        base_url=f"http://127.0.0.1:{procs.gateway_port}", api_key="tml-local"
    )
    # The only worker is frozen, and still alive to the scheduler a few seconds: it is given
    # the create. t2 starts only then, so the create has nowhere to go when t1 is given up.
    procs.kill("t1", signal.SIGSTOP)
    creating = service.create_lora_training_client(base_model="tiny", rank=4, seed=0)
    assert _placed(procs) == "t1"
    procs.start("t2", "trainer", SWARM_WORKER_ID="t2")
    training = creating.result(timeout=240)
    assert _holder(procs, training.model_id) == "t2"
    _step(training)  # no call lost: the first one after the create works

    # t1 wakes, finishes building the model for its lease that ended and answers: a stale
    # reply, dropped (the model stays where it moved), and it is alive again.
    procs.kill("t1", signal.SIGCONT)
    procs.wait_worker("t1", lambda w: w["state"] == "alive", timeout=60)
    gateway_log = procs.root / "logs" / "gateway.log"
    for _ in range(120):
        if "a stale reply (attempt 1)" in gateway_log.read_text():
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"the woken worker's reply was not seen\n{procs.logs()}")
    assert _holder(procs, training.model_id) == "t2"
    holder, other = "t2", "t1"

    _step(training)  # never saved: the restore starts from the initial weights
    procs.kill(holder, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(tinker.RequestFailedError) as lost:
            logprobs(training)
        message = str(lost.value)
        assert f"restored on worker {other} from its initial weights" in message, message
        assert "resumes from step 0" in message, message
        assert time.monotonic() - started < 60, "the loss was noticed late"
    finally:
        procs.kill(holder)
    initial = logprobs(training)
    _step(training)
    assert logprobs(training) != pytest.approx(initial, abs=1e-6)
    service.close("success").result(timeout=60)
