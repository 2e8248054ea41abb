"""The worker's side of a training session's lease (swarm_trainer.sessions_host): it lists what
it holds, refuses calls of another attempt, writes a save only while the scheduler says the
attempt is still its own, and answers a call again from the last answers it keeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm_contracts.jobs import ModelRef
from swarm_contracts.sessions import CreateSession, HeldSession, SessionCall, SessionResult
from swarm_runtime.rpc import Refused
from swarm_runtime.store import LocalStore
from swarm_trainer.session import TrainingSession
from swarm_trainer.sessions_host import ANSWERS_KEPT, Held, SessionHost
from swarm_trainer.tiny_model import create_tiny_model

SESSION = "tsess-0123456789abcdef-train-0"


@pytest.fixture
def host(tmp_path: Path) -> tuple[SessionHost, dict[str, bool], LocalStore]:
    """A host holding attempt 2 of SESSION (a real model), and the scheduler's answer."""
    store = LocalStore(tmp_path / "store")
    ours = {"holds": True}
    asked: list[tuple[str, int]] = []

    async def holds(session: str, attempt: int) -> bool:
        asked.append((session, attempt))
        return ours["holds"]

    host = SessionHost(store, cache=None, idle_s=600, holds=holds)  # type: ignore[arg-type]
    ref = ModelRef(name="tiny", version=1, store_key="-", digest="-")
    model = TrainingSession(
        CreateSession(base_model=ref, rank=2, seed=0), create_tiny_model(tmp_path / "tiny")
    )
    host.held[SESSION] = Held("a", model, attempt=2, store=store)
    return host, ours, store


def call(seq_id: int, attempt: int, op: str = "save_state") -> SessionCall:
    return SessionCall(
        session=SESSION,
        tenant="a",
        seq_id=seq_id,
        attempt=attempt,
        op=op,  # type: ignore[arg-type]
        store_key=f"tinker/a/{SESSION}/weights/s{seq_id}",
    )


def test_the_host_lists_what_it_holds_and_builds(
    host: tuple[SessionHost, dict[str, bool], LocalStore],
) -> None:
    h, _, _ = host
    h.building["tsess-fedcba9876543210-train-1"] = 1
    assert h.listed() == [
        HeldSession(session=SESSION, attempt=2),
        HeldSession(session="tsess-fedcba9876543210-train-1", attempt=1),
    ]


async def test_a_call_of_another_attempt_is_refused(
    host: tuple[SessionHost, dict[str, bool], LocalStore],
) -> None:
    h, _, store = host
    with pytest.raises(Refused, match=r"attempt 1 of session .* is not this worker's") as refused:
        await h.call(call(1, attempt=1))
    assert refused.value.code == "forbidden"
    assert not store.list("tinker/")
    result = await h.call(call(2, attempt=2))  # its own attempt: saved
    assert result.store_key == f"tinker/a/{SESSION}/weights/s2"
    assert store.list(result.store_key)


async def test_a_save_after_the_session_moved_on_writes_nothing(
    host: tuple[SessionHost, dict[str, bool], LocalStore],
) -> None:
    h, ours, store = host
    ours["holds"] = False  # the scheduler leased the session elsewhere meanwhile
    with pytest.raises(Refused, match="no longer holds attempt 2") as fenced:
        await h.call(call(1, attempt=2, op="save_weights_for_sampler"))
    assert fenced.value.code == "forbidden"
    assert not store.list("tinker/")
    assert SESSION not in h.held  # let go: its model's memory is freed


async def test_a_call_is_answered_again_from_the_kept_answers(
    host: tuple[SessionHost, dict[str, bool], LocalStore],
) -> None:
    """A gateway that adopted a dead one's future asks for the call's answer again: the same
    answer, not a second run (the store holds one save), and a refusal stays a refusal."""
    h, _, store = host
    saved = await h.call(call(3, attempt=2))
    with pytest.raises(Refused, match="no path"):
        await h.call(call(4, attempt=2, op="load_state").model_copy(update={"store_key": None}))
    keys = store.list("tinker/")

    again = await h.call(call(3, attempt=2, op="answer_again"))
    assert again == saved
    assert store.list("tinker/") == keys
    with pytest.raises(Refused, match="no path"):
        await h.call(call(4, attempt=2, op="answer_again"))
    info = await h.call(call(0, attempt=2, op="answer_again"))  # the create: the model's info
    assert info.model_info == h.held[SESSION].session.info().model_info  # type: ignore[attr-defined]
    with pytest.raises(Refused, match="keeps no answer to it") as none:
        await h.call(call(9, attempt=2, op="answer_again"))
    assert none.value.code == "internal"
    with pytest.raises(Refused, match="not this worker's"):
        await h.call(call(3, attempt=1, op="answer_again"))


async def test_only_the_last_answers_are_kept(
    host: tuple[SessionHost, dict[str, bool], LocalStore],
) -> None:
    h, _, _ = host
    held = h.held[SESSION]
    for seq in range(1, ANSWERS_KEPT + 3):
        held.answered(seq, SessionResult(step=seq))
    assert sorted(held.answers) == list(range(3, ANSWERS_KEPT + 3))
    with pytest.raises(Refused, match="keeps no answer"):
        await h.call(call(2, attempt=2, op="answer_again"))
