"""The telemetry HTTP API: job series, health, Prometheus exposition."""

from __future__ import annotations

from fastapi import FastAPI, HTTPException, Query, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from swarm_contracts.metrics import JobMetrics
from swarm_telemetry.prometheus_metrics import PrometheusMetrics
from swarm_telemetry.series import SeriesStore


def build_http(series: SeriesStore, prometheus: PrometheusMetrics) -> FastAPI:
    http = FastAPI(title="Swarm telemetry", version="1")

    @http.get("/v1/jobs/{job_id}/metrics", response_model=JobMetrics)
    async def job_metrics(
        job_id: str, max_points: int | None = Query(default=None, ge=2)
    ) -> JobMetrics:
        metrics = series.get(job_id, max_points)
        if metrics is None:
            raise HTTPException(404, f"unknown job {job_id!r}")
        return metrics

    @http.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @http.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(prometheus.registry), media_type=CONTENT_TYPE_LATEST)

    return http
