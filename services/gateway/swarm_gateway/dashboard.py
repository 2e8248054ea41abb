"""The web dashboard: one HTML page and its plain JS/CSS, served from the package.

No CDN and no build step: the page must work on an air-gapped cluster and in a wheel, so the
assets ship as package data (see ``[tool.setuptools.package-data]``) and are served from an
allow-list rather than a directory mount, which could expose anything dropped next to them.
The page talks to the public ``/v1`` API with the caller's own key; it has no privileges of
its own.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException, status
from fastapi.responses import FileResponse, JSONResponse

from swarm_contracts.events import job_lifecycle

STATIC_DIR = Path(__file__).parent / "static"

# name -> media type: the only files this router will ever send.
ASSETS: dict[str, str] = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "chart.js": "text/javascript; charset=utf-8",
    "sweeps.js": "text/javascript; charset=utf-8",
    "tinker.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}

# Scripts and styles only from this origin (no inline code, no third parties), API calls only
# to this origin: an injected job name cannot run script even if escaping were ever missed.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Small files that change with the package: revalidating is cheap and avoids stale JS.
    "Cache-Control": "no-cache",
}

router = APIRouter(tags=["dashboard"], include_in_schema=False)


def _send(name: str, media_type: str) -> FileResponse:
    path = STATIC_DIR / name
    if not path.is_file():
        # A broken install (package data left out), not a client error: say so plainly.
        raise HTTPException(
            status.HTTP_500_INTERNAL_SERVER_ERROR,
            detail=f"dashboard asset {name} is missing from the swarm_gateway package",
        )
    return FileResponse(path, media_type=media_type, headers=SECURITY_HEADERS)


# Both paths serve the page from the root "directory", so its relative URLs ("dashboard/…",
# "v1/…") resolve the same way from either, and behind a reverse proxy's path prefix too.
@router.get("/")
@router.get("/dashboard")
async def dashboard_page() -> FileResponse:
    return _send("index.html", "text/html; charset=utf-8")


@router.get("/dashboard/lifecycle.json")
async def dashboard_lifecycle() -> JSONResponse:
    """What the job states and events mean (``swarm_contracts.events``), so that the page
    keeps no list of its own."""
    body = job_lifecycle().model_dump(mode="json")
    return JSONResponse(body, headers=SECURITY_HEADERS)


@router.get("/dashboard/{asset}")
async def dashboard_asset(asset: str) -> FileResponse:
    media_type = ASSETS.get(asset)
    if media_type is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no dashboard asset {asset}")
    return _send(asset, media_type)
