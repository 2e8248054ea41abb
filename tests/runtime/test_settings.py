"""Settings that derive something: the OTLP/HTTP URL of each signal."""

from __future__ import annotations

from swarm_runtime.settings import Settings


def test_otlp_url_appends_the_signal_path_once() -> None:
    assert Settings().otlp_url("traces") is None
    collector = Settings(otel_endpoint="http://collector:4318/")
    assert collector.otlp_url("traces") == "http://collector:4318/v1/traces"
    assert collector.otlp_url("metrics") == "http://collector:4318/v1/metrics"
    full = Settings(otel_endpoint="http://collector:4318/v1/metrics")
    assert full.otlp_url("metrics") == "http://collector:4318/v1/metrics"
