"""Subject, stream and bucket names. The un-namespaced names are the public contract."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Subjects:
    """All names for one namespace; ``Subjects("")`` gives the contract names."""

    namespace: str = ""

    def _s(self, subject: str) -> str:
        return f"{self.namespace}.{subject}" if self.namespace else subject

    def _n(self, name: str) -> str:
        return f"{self.namespace.upper().replace('-', '_')}_{name}" if self.namespace else name

    # --- contract subjects -------------------------------------------------------------
    @property
    def submit(self) -> str:
        return self._s("swarm.jobs.submit")

    def cancel(self, job_id: str = "*") -> str:
        return self._s(f"swarm.jobs.{job_id}.cancel")

    def job_event(self, job_id: str = "*", event: str = "*") -> str:
        return self._s(f"swarm.jobs.{job_id}.events.{event}")

    def heartbeat(self, worker_id: str = "*") -> str:
        return self._s(f"swarm.workers.{worker_id}.heartbeat")

    def assign(self, worker_id: str = "*") -> str:
        return self._s(f"swarm.workers.{worker_id}.assign")

    def adapter_registered(self, name: str = "*") -> str:
        return self._s(f"swarm.adapters.{name}.registered")

    def adapter_promoted(self, name: str = "*") -> str:
        return self._s(f"swarm.adapters.{name}.promoted")

    # --- internal request/reply and plumbing -------------------------------------------
    def dead_letter(self, service: str = "*") -> str:
        return self._s(f"swarm.dlq.{service}")

    def registry(self, action: str) -> str:
        """Registry queries, e.g. ``registry("models.get")``."""
        return self._s(f"swarm.registry.{action}")

    def trainer(self, action: str) -> str:
        """Requests any trainer agent can answer, e.g. ``trainer("export")``."""
        return self._s(f"swarm.trainer.{action}")

    def telemetry(self, action: str) -> str:
        return self._s(f"swarm.telemetry.{action}")

    # --- JetStream streams ---------------------------------------------------------------
    @property
    def submit_stream(self) -> str:
        return self._n("SWARM_SUBMIT")

    @property
    def events_stream(self) -> str:
        return self._n("SWARM_EVENTS")

    @property
    def control_stream(self) -> str:
        return self._n("SWARM_CONTROL")

    @property
    def assign_stream(self) -> str:
        return self._n("SWARM_ASSIGN")

    @property
    def adapters_stream(self) -> str:
        return self._n("SWARM_ADAPTERS")

    @property
    def dead_letter_stream(self) -> str:
        return self._n("SWARM_DLQ")

    # --- KV buckets ----------------------------------------------------------------------
    def bucket(self, name: str) -> str:
        """KV bucket names: jobs, workers, datasets, models, adapters."""
        return self._n(f"swarm_{name}")
