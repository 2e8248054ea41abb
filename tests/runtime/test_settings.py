"""Settings that derive something (the OTLP/HTTP URL of each signal), and a service's own
settings made from the shared ones."""

from __future__ import annotations

import pytest
from pydantic import SecretStr, ValidationError

from swarm_runtime.settings import Settings


class ServiceSettings(Settings):
    """A service's own settings, as ``swarm_<service>.settings`` declares them."""

    knob: float = 1.0


def test_otlp_url_appends_the_signal_path_once() -> None:
    assert Settings().otlp_url("traces") is None
    collector = Settings(otel_endpoint="http://collector:4318/")
    assert collector.otlp_url("traces") == "http://collector:4318/v1/traces"
    assert collector.otlp_url("metrics") == "http://collector:4318/v1/metrics"
    full = Settings(otel_endpoint="http://collector:4318/v1/metrics")
    assert full.otlp_url("metrics") == "http://collector:4318/v1/metrics"


def test_a_service_gets_its_own_settings_from_the_shared_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shared = Settings(nats_url="nats://elsewhere:4222", namespace="t1", s3_secret_key="s")
    monkeypatch.setenv("SWARM_KNOB", "2.5")  # its own, from the environment as always
    own = ServiceSettings.of(shared)
    assert (own.nats_url, own.namespace, own.knob) == ("nats://elsewhere:4222", "t1", 2.5)
    assert own.s3_secret_key == SecretStr("s")
    assert ServiceSettings.of(shared, knob=4.0, namespace="t2").knob == 4.0
    assert ServiceSettings.of(own) is own  # already its own: unchanged
    # And back: the shared ones of a service's settings keep what they share.
    assert Settings.of(own).namespace == "t1"


def test_a_setting_the_class_lacks_is_refused_not_dropped() -> None:
    # A service's knob given to the shared settings would otherwise be lost without a word.
    with pytest.raises(ValidationError, match="knob"):
        Settings(knob=3.0)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="nope"):
        ServiceSettings.of(Settings(), nope=1)


def test_unknown_swarm_variables_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # Another service's, or the CLI's (SWARM_GATEWAY_URL): none of this class's business.
    monkeypatch.setenv("SWARM_GATEWAY_URL", "http://gw:8080")
    monkeypatch.setenv("SWARM_KNOB", "7")
    assert Settings().nats_url == "nats://127.0.0.1:4222"
