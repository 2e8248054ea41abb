"""Stopping background tasks: a stop ends even when a task swallows its cancellation."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from swarm_runtime.tasks import cancel_and_wait


async def swallows_cancellations(swallow: list[int], calls: list[str]) -> None:
    """A loop that logs errors and carries on, whose first ``swallow[0]`` cancellations reach
    it as something else (as Python 3.11's ``wait_for`` inside nats-py can turn them into a
    ``TimeoutError``)."""
    while True:
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            calls.append("cancelled")
            if len(calls) <= swallow[0]:
                continue
            raise


async def test_a_task_that_swallows_a_cancellation_is_cancelled_again_until_it_ends() -> None:
    calls: list[str] = []
    task = asyncio.create_task(swallows_cancellations([2], calls))
    await asyncio.sleep(0.02)

    await cancel_and_wait([task], timeout=5)

    assert task.cancelled()
    assert calls == ["cancelled"] * 3


async def test_a_task_that_never_ends_holds_the_stop_only_until_the_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []
    swallow = [10**6]
    task = asyncio.create_task(swallows_cancellations(swallow, calls))
    await asyncio.sleep(0.02)

    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="swarm.tasks"):
        await cancel_and_wait([task], timeout=1.2)

    assert 1.0 < time.monotonic() - started < 3
    assert not task.done()
    assert "did not stop" in caplog.text
    assert len(calls) >= 2  # cancelled again meanwhile
    # Let it go: it takes the next cancellation (no more are swallowed).
    swallow[0] = 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_error_a_task_ends_with_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fails_on_cancel() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise RuntimeError("broken while stopping") from None

    task = asyncio.create_task(fails_on_cancel(), name="fails-on-cancel")
    done = asyncio.create_task(asyncio.sleep(0))
    await asyncio.sleep(0.01)

    with caplog.at_level(logging.WARNING, logger="swarm.tasks"):
        await cancel_and_wait([task, done, None])

    assert "fails-on-cancel ended with RuntimeError('broken while stopping')" in caplog.text
