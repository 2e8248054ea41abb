"""Providers: independent machine owners who join a Swarm with their own NATS identity.

An admin runs ``swarm providers add NAME``: a NATS nkey user whose permissions are
``provider_permissions(NAME)`` goes into the nats-server config, and the provider gets a
``ProviderCredentials`` file. The provider's trainer agent (``swarm-trainer join``) runs with
worker id NAME, so that every per-worker subject it may use is its own (docs/providers.md).
"""

from __future__ import annotations

import hashlib
import hmac
import stat
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, Field

from swarm_contracts.jobs import utcnow
from swarm_contracts.names import NAME_PATTERN
from swarm_contracts.subjects import Subjects

# The header a trainer puts on each job event it publishes: the attempt token its assignment
# carried. The scheduler applies a worker's event to the job record only with the token of the
# record's current attempt (only the worker that was assigned that attempt ever saw it).
ATTEMPT_TOKEN_HEADER = "Swarm-Attempt-Token"


def token_digest(token: str) -> str:
    """What the job record keeps of an attempt token (the token itself is never stored)."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(digest: str | None, token: str | None) -> bool:
    """Whether ``token`` is the one whose digest a job record keeps for its current attempt.
    Only the worker given that attempt received it (in its assignment, on its own subject).
    Records placed before attempt tokens existed have no digest and accept any sender."""
    if digest is None:
        return True
    return token is not None and hmac.compare_digest(token_digest(token), digest)


class ProviderCredentials(BaseModel):
    """The file a provider joins with (``swarm-trainer join --creds FILE``), mode 0600.

    The seed is the provider's NATS identity: whoever holds the file can act as the provider.
    """

    provider: str = Field(pattern=NAME_PATTERN, description="also the agent's worker id")
    nkey_seed: str = Field(repr=False, description="the NATS user nkey seed (SU...)")
    public_key: str = Field(description="the NATS user's public nkey (U...)")
    nats_url: str | None = Field(default=None, description="where to join, if the admin knew")
    created_at: datetime = Field(default_factory=utcnow)


def read_credentials(path: Path) -> ProviderCredentials:
    """A provider's join file; refused when others than its owner may read it (like ssh)."""
    if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PermissionError(f"{path} is readable by others: chmod 600 {path}")
    return ProviderCredentials.model_validate_json(path.read_text())


class Permissions(BaseModel):
    """A nats-server user's permissions, as the config file writes them."""

    publish_allow: list[str]
    publish_deny: list[str]
    subscribe_allow: list[str]
    subscribe_deny: list[str]
    # May answer the requests it receives (on the requester's reply subject, once each).
    allow_responses: bool = False


def consumer_name(worker_id: str) -> str:
    """The durable JetStream consumer a trainer pulls its assignments from."""
    return f"trainer-{worker_id}"


def provider_permissions(name: str, subjects: Subjects | None = None) -> Permissions:
    """Exactly what a provider's agent (worker id ``name``) needs, and nothing of anyone else's.

    * its own per-worker subjects: heartbeats out; assignments (through its own durable
      consumer on the assignments stream, created with its filter subject in the API subject,
      so that it cannot be pointed at another worker's assignments), cancels, hand-back
      requests and self-benchmark requests in (answering the latter);
    * job events for any job id (NATS cannot scope ids it does not know yet): the scheduler
      only applies an event that carries the attempt token of the job's current attempt,
      which only the assigned worker received (``ATTEMPT_TOKEN_HEADER``);
    * adapter registration (the registry checks the job and attempt) and its dead letters;
    * store access grants (``swarm.registry.store.access``: the registry checks the attempt
      token and the job's scope), since a provider holds no store keys;
    * reading one job record by id (``$JS.API.DIRECT.GET``, never listing or by sequence):
      the agent checks that an assignment is still current; job ids are unguessable digests.

    Everything else is denied: stream and bucket management, KV writes, submitting jobs,
    every other worker's subjects, reading job events.
    """
    s = subjects or Subjects()
    consumer = consumer_name(name)
    assign, events = s.assign_stream, s.events_stream
    jobs_kv = f"KV_{s.bucket('jobs')}"
    api = "$JS.API"
    return Permissions(
        publish_allow=[
            s.heartbeat(name),
            s.job_event(),
            s.registry("adapters.register"),
            s.registry("store.access"),
            s.dead_letter("trainer"),
            f"{api}.INFO",
            f"{api}.STREAM.INFO.{assign}",
            f"{api}.STREAM.INFO.{events}",
            f"{api}.STREAM.INFO.{jobs_kv}",
            f"{api}.CONSUMER.INFO.{assign}.{consumer}",
            f"{api}.CONSUMER.CREATE.{assign}.{consumer}.{s.assign(name)}",
            f"{api}.CONSUMER.MSG.NEXT.{assign}.{consumer}",
            f"{api}.DIRECT.GET.{jobs_kv}.$KV.{s.bucket('jobs')}.*",
            f"$JS.ACK.{assign}.{consumer}.>",
        ],
        # Spelled out although nothing above allows them, so that a later, wider allow entry
        # cannot open them by accident.
        publish_deny=[
            s.submit,
            s.assign(),
            "$KV.>",
            f"{api}.STREAM.CREATE.>",
            f"{api}.STREAM.UPDATE.>",
            f"{api}.STREAM.DELETE.>",
            f"{api}.STREAM.PURGE.>",
            f"{api}.CONSUMER.DURABLE.CREATE.>",
        ],
        subscribe_allow=[
            "_INBOX.>",
            s.assign(name),
            s.worker_cancel(name),
            s.release(name),
            s.benchmark(name),
        ],
        subscribe_deny=[s.job_event(), s.cancel(), s.submit],
        allow_responses=True,
    )
