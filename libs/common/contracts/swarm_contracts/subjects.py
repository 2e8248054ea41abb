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

    def pause(self, job_id: str = "*") -> str:
        """Checkpoint a running job, free its worker and keep it paused."""
        return self._s(f"swarm.jobs.{job_id}.pause")

    def resume(self, job_id: str = "*") -> str:
        """Queue a paused job again, from its checkpoint."""
        return self._s(f"swarm.jobs.{job_id}.resume")

    def verify(self, job_id: str = "*") -> str:
        """Replay part of a finished job on another worker (swarm_contracts.verification)."""
        return self._s(f"swarm.jobs.{job_id}.verify")

    def job_event(self, job_id: str = "*", event: str = "*") -> str:
        return self._s(f"swarm.jobs.{job_id}.events.{event}")

    def heartbeat(self, worker_id: str = "*") -> str:
        return self._s(f"swarm.workers.{worker_id}.heartbeat")

    def assign(self, worker_id: str = "*") -> str:
        return self._s(f"swarm.workers.{worker_id}.assign")

    def release(self, worker_id: str = "*") -> str:
        """The scheduler asks a worker to checkpoint some of its jobs and hand them back."""
        return self._s(f"swarm.workers.{worker_id}.release")

    def benchmark(self, worker_id: str = "*") -> str:
        """Ask a worker to run its self-benchmark again (request/reply)."""
        return self._s(f"swarm.workers.{worker_id}.benchmark")

    def worker_cancel(self, worker_id: str = "*") -> str:
        """The scheduler passes a cancellation on to the worker that holds the job (a
        provider's agent may not listen to every job's cancel subject)."""
        return self._s(f"swarm.workers.{worker_id}.cancel")

    # --- a worker's own subjects (its NATS permissions allow only its own worker id) --------
    def worker_event(self, worker_id: str = "*", job_id: str = "*", event: str = "*") -> str:
        """A worker's event of a job, as the worker sends it. The scheduler reads these,
        applies an event only if ``worker_id`` holds the job's current attempt, and publishes
        what it accepted on ``job_event`` (the subjects everyone else reads)."""
        return self._s(f"swarm.workers.{worker_id}.events.{job_id}.{event}")

    def worker_registry(self, action: str, worker_id: str = "*") -> str:
        """A worker's requests to the registry (``adapters.register``, ``store.access``): the
        registry takes the sender from the subject."""
        return self._s(f"swarm.workers.{worker_id}.registry.{action}")

    def worker_attempt(self, worker_id: str = "*") -> str:
        """A worker asks the scheduler whether it still holds an attempt (request/reply)."""
        return self._s(f"swarm.workers.{worker_id}.attempt")

    def worker_session(self, worker_id: str = "*", session: str = "*") -> str:
        """A Tinker training session's calls, gateway -> the worker that holds the session
        (request/reply, swarm_contracts.sessions): only that worker hears them."""
        return self._s(f"swarm.workers.{worker_id}.sessions.{session}")

    @staticmethod
    def worker_of(subject: str) -> str | None:
        """The worker id in a ``swarm.workers.<id>.…`` subject (namespaced or not)."""
        parts = subject.split(".")
        for i in range(len(parts) - 2):
            if parts[i] == "swarm" and parts[i + 1] == "workers":
                return parts[i + 2]
        return None

    @staticmethod
    def job_of_worker_event(subject: str) -> str:
        """The job id in a ``worker_event`` subject (``….events.<job_id>.<event>``)."""
        return subject.split(".")[-2]

    # --- inboxes: each identity subscribes only under its own prefix ----------------------
    @staticmethod
    def service_inbox(service: str) -> str:
        """Reply and delivery subjects of a service's connections (``_INBOX.svc.<service>``)."""
        return f"_INBOX.svc.{service}"

    @staticmethod
    def worker_inbox(worker_id: str) -> str:
        """Reply and delivery subjects of a provider's agent (``_INBOX.worker.<id>``): a
        separate branch, so that no provider name can be a service's prefix."""
        return f"_INBOX.worker.{worker_id}"

    def adapter_registered(self, name: str = "*") -> str:
        return self._s(f"swarm.adapters.{name}.registered")

    def adapter_promoted(self, name: str = "*") -> str:
        return self._s(f"swarm.adapters.{name}.promoted")

    @property
    def sweep_submit(self) -> str:
        return self._s("swarm.sweeps.submit")

    def sweep_cancel(self, sweep_id: str = "*") -> str:
        return self._s(f"swarm.sweeps.{sweep_id}.cancel")

    def sweep_event(self, sweep_id: str = "*", event: str = "*") -> str:
        return self._s(f"swarm.sweeps.{sweep_id}.events.{event}")

    def inference_generate(self, base_model: str = "*", version: int | str = "*") -> str:
        """Generation requests for one base model version (a queue group of its workers)."""
        return self._s(f"swarm.inference.{base_model}.{version}.generate")

    def inference_heartbeat(self, worker_id: str = "*") -> str:
        return self._s(f"swarm.inference.workers.{worker_id}.heartbeat")

    def inference_cancel(self, request_id: str = "*") -> str:
        """Stop generating for a request whose caller went away (every worker listens)."""
        return self._s(f"swarm.inference.requests.{request_id}.cancel")

    # --- internal request/reply and plumbing -------------------------------------------
    def dead_letter(self, service: str = "*") -> str:
        return self._s(f"swarm.dlq.{service}")

    def registry(self, action: str) -> str:
        """Registry queries, e.g. ``registry("models.get")``."""
        return self._s(f"swarm.registry.{action}")

    def scheduler(self, action: str) -> str:
        """Requests to the leading scheduler, e.g. ``scheduler("sessions.place")``."""
        return self._s(f"swarm.scheduler.{action}")

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
    def worker_events_stream(self) -> str:
        """Workers' job events as they sent them, read only by the scheduler."""
        return self._n("SWARM_WORKER_EVENTS")

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
    def sweeps_stream(self) -> str:
        """Sweep submissions and cancellations."""
        return self._n("SWARM_SWEEPS")

    @property
    def sweep_events_stream(self) -> str:
        return self._n("SWARM_SWEEP_EVENTS")

    @property
    def dead_letter_stream(self) -> str:
        return self._n("SWARM_DLQ")

    # --- KV buckets ----------------------------------------------------------------------
    def bucket(self, name: str) -> str:
        """KV bucket names: jobs, workers, worker_ops, datasets, models, adapters, leader, sweeps,
        trials."""
        return self._n(f"swarm_{name}")
