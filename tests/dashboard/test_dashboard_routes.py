"""The dashboard's HTTP side, without a browser: what is served, how, and what ships."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from swarm_contracts.events import MEANINGS
from swarm_contracts.jobs import JobState
from swarm_gateway import dashboard
from swarm_gateway.app import create_app
from swarm_gateway.settings import GatewaySettings

GATEWAY = Path(__file__).resolve().parents[2] / "services" / "gateway"


@pytest.fixture(scope="module")
def client() -> TestClient:
    # No `with`: the lifespan (NATS) is not needed to serve static files, and must not be.
    return TestClient(create_app(GatewaySettings(api_keys="k=acme")))


@pytest.mark.parametrize("path", ["/", "/dashboard"])
def test_the_page_is_served_without_auth_and_locked_down(client: TestClient, path: str) -> None:
    # The page itself carries no data, so it needs no key even with auth on (it asks for one).
    resp = client.get(path)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/html")
    assert "<title>Swarm dashboard</title>" in resp.text
    csp = resp.headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "connect-src 'self'" in csp
    assert "unsafe-inline" not in csp
    assert resp.headers["x-content-type-options"] == "nosniff"


def test_every_asset_the_page_references_is_served(client: TestClient) -> None:
    html = client.get("/").text
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert refs
    assert all(r.startswith("dashboard/") for r in refs), refs
    for ref in refs:
        resp = client.get("/" + ref)
        assert resp.status_code == 200, ref
        expected = "text/javascript" if ref.endswith(".js") else "text/css"
        assert resp.headers["content-type"].startswith(expected)
    assert {r.removeprefix("dashboard/") for r in refs} == set(dashboard.ASSETS)


def test_no_inline_script_or_third_party_url() -> None:
    # CSP forbids inline code, and the page must work offline: no CDN, no external fonts.
    html = (dashboard.STATIC_DIR / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "inline <script>"
    assert not re.search(r"\son[a-z]+=", html), "inline event handler"
    for path in dashboard.STATIC_DIR.iterdir():
        urls = re.findall(r"https?://[^\s\"')]+", path.read_text())
        # The SVG namespace is an identifier, not a fetch.
        assert set(urls) <= {"http://www.w3.org/2000/svg"}, (path.name, urls)


def test_the_page_reads_what_states_and_events_mean_from_the_contracts(
    client: TestClient,
) -> None:
    resp = client.get("/dashboard/lifecycle.json")  # no key: it says nothing about any job
    assert resp.status_code == 200
    assert "script-src 'self'" in resp.headers["content-security-policy"]
    life = resp.json()
    assert [(s["name"], s["terminal"]) for s in life["states"]] == [
        (s.value, s.terminal) for s in JobState
    ]
    assert life["events"]["replayed"]["terminal"] is True
    assert set(life["events"]) == set(MEANINGS)
    # The page uses it, and keeps no list of its own (tests/test_architecture.py).
    assert "dashboard/lifecycle.json" in (dashboard.STATIC_DIR / "dashboard.js").read_text()


@pytest.mark.parametrize("path", ["/dashboard/app.py", "/dashboard/..%2fapp.py", "/dashboard/x"])
def test_only_listed_assets_are_served(client: TestClient, path: str) -> None:
    assert client.get(path).status_code == 404


def test_assets_ship_as_package_data() -> None:
    project = tomllib.loads((GATEWAY / "pyproject.toml").read_text())
    globs = project["tool"]["setuptools"]["package-data"]["swarm_gateway"]
    shipped = {p.name for g in globs for p in (GATEWAY / "swarm_gateway").glob(g)}
    assert {"index.html", *dashboard.ASSETS} <= shipped
