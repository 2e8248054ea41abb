"""Reconnecting to a job's SSE stream with Last-Event-ID loses and repeats nothing."""

from __future__ import annotations

import asyncio

import httpx

from swarm import AsyncClient, Client
from swarm_contracts.events import Failed, Progress, Succeeded
from swarm_contracts.jobs import AdapterRef, JobRecord, JobState
from swarm_runtime.settings import Settings

from ..conftest import ServerThread
from .test_jobs import dataset, fake_scheduler, read_sse_until, reporting, spec

STEPS = 40


async def test_reconnects_while_events_keep_coming(
    live_gateway: ServerThread, settings: Settings
) -> None:
    async with reporting(settings, live_gateway.url) as (_, report, c):
        job_id = (await c.post("/v1/jobs", json=spec(await dataset(c)))).json()["job_id"]

        async def publish() -> None:
            for step in range(1, STEPS + 1):
                event = Progress(
                    job_id=job_id,
                    step=step,
                    max_steps=STEPS,
                    loss=1.0,
                    lr=1e-4,
                    tokens_per_s=1.0,
                )
                await report(event)
                await asyncio.sleep(0.01)
            adapter = AdapterRef(name="bot", version=1, store_key="adapters/default/bot/1")
            await report(Succeeded(job_id=job_id, adapter=adapter))

        publisher = asyncio.create_task(publish())
        # Drop the connection every 7 events, mid-publishing, and resume from the last id.
        seen: list[tuple[str, str, dict]] = []
        while not seen or seen[-1][0] != "succeeded":
            headers = {"Last-Event-ID": seen[-1][1]} if seen else {}
            async with c.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as resp:
                assert resp.status_code == 200
                seen += await read_sse_until(resp, 7)
        await publisher

        steps = [e[2]["data"]["step"] for e in seen if e[0] == "progress"]
        assert steps == list(range(1, STEPS + 1))
        assert [e[0] for e in seen].count("succeeded") == 1
        ids = [int(e[1]) for e in seen]
        assert ids == sorted(set(ids))  # strictly increasing: no event twice

        # The SDK clients resume the same way from a given event id.
        middle = seen[STEPS // 2][1]
        sync_rest = [e.id for e in Client(live_gateway.url).events(job_id, last_event_id=middle)]
        async with AsyncClient(live_gateway.url) as ac:
            async_rest = [e.id async for e in ac.events(job_id, last_event_id=middle)]
        expected = [e[1] for e in seen[STEPS // 2 + 1 :]]
        assert sync_rest == async_rest == expected


async def test_a_stale_attempt_s_terminal_event_does_not_end_the_stream(
    live_gateway: ServerThread, settings: Settings
) -> None:
    async with reporting(settings, live_gateway.url) as (jobs, report, c):
        job_id = (await c.post("/v1/jobs", json=spec(await dataset(c)))).json()["job_id"]

        def second_attempt(r: JobRecord) -> JobRecord:
            r.attempt, r.state = 2, JobState.running
            return r

        await jobs.modify(job_id, second_attempt)
        adapter = AdapterRef(name="bot", version=1, store_key="adapters/default/bot/1")
        for event in (
            Failed(job_id=job_id, attempt=1, reason="worker lost"),  # late, from attempt 1
            Progress(
                job_id=job_id, attempt=2, step=1, max_steps=1, loss=1.0, lr=1e-4, tokens_per_s=1
            ),
            Succeeded(job_id=job_id, attempt=2, adapter=adapter),
        ):
            await report(event)
        async with c.stream("GET", f"/v1/jobs/{job_id}/events") as resp:
            seen = await read_sse_until(resp, 10)  # returns when the stream ends
        assert [(e[0], e[2]["data"]["attempt"]) for e in seen] == [
            ("failed", 1),
            ("progress", 2),
            ("succeeded", 2),
        ]


async def test_bad_last_event_id_is_a_422(live_gateway: ServerThread, settings: Settings) -> None:
    nc, _ = await fake_scheduler(settings)
    try:
        async with httpx.AsyncClient(base_url=live_gateway.url, timeout=10) as c:
            job_id = (await c.post("/v1/jobs", json=spec(await dataset(c)))).json()["job_id"]
            for bad in ("abc", "-5"):
                resp = await c.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": bad})
                assert resp.status_code == 422, resp.text
    finally:
        await nc.close()
