"""`swarm up` gives every service without an HTTP API its own /metrics port."""

from __future__ import annotations

import time

import httpx

from .conftest import Stack


def scrape(port: int, timeout_s: float = 90.0) -> str:
    # The trainer serves /metrics once its agent has started (Ray start-up takes a while).
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_every_service_of_the_stack_serves_its_metrics(stack: Stack) -> None:
    assert set(stack.local.metrics_ports) == {
        "scheduler",
        "registry",
        "trainer",
        "sweeps",
        "inference",
    }
    for service, port in stack.local.metrics_ports.items():
        assert f"swarm_{service}_" in scrape(port), service
    # The scheduler sees the stack's one trainer as a live worker (after its first heartbeat).
    alive = 'swarm_scheduler_workers{state="alive"} 1.0'
    deadline = time.monotonic() + 30
    while alive not in (body := scrape(stack.local.metrics_ports["scheduler"])):
        assert time.monotonic() < deadline, body
        time.sleep(0.5)
