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
from swarm_contracts.registry_api import WORKER_ACTIONS
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

    Everything it sends is on its own ``swarm.workers.<name>.…`` subjects, so that whoever
    receives it knows the sender from the subject (NATS enforces it):

    * heartbeats; job events (``swarm.workers.<name>.events.<job>.<event>``, a stream only the
      scheduler reads: it applies and republishes an event only if ``name`` holds the job's
      current attempt and the event carries that attempt's token, ``ATTEMPT_TOKEN_HEADER``);
    * requests to the registry (adapter registration, store access grants: ``name`` must hold
      the job's current attempt) and to the scheduler (does it still hold an attempt);
    * its assignments, through its own durable consumer on the assignments stream, created
      with its filter subject in the API subject so that it cannot be pointed at another
      worker's; cancels, hand-back and self-benchmark requests in (answering the latter), and
      the calls of the training sessions placed on it (answering them);
    * replies only under its own inbox prefix ``_INBOX.worker.<name>`` (the agent connects
      with it): no other identity's replies, KV watches or deliveries.

    Nothing lets it read a job record, list streams, stream subjects or consumers (no
    ``STREAM.INFO``, ``STREAM.NAMES``, ``DIRECT.GET``): what a job needs comes with its
    assignment. Everything else is denied: stream and bucket management, KV writes,
    submitting jobs, every other worker's subjects, public job events.
    """
    s = subjects or Subjects()
    consumer = consumer_name(name)
    assign = s.assign_stream
    api = "$JS.API"
    return Permissions(
        publish_allow=[
            s.heartbeat(name),
            s.worker_event(name, "*", "*"),
            *(s.worker_registry(action.name, name) for action in WORKER_ACTIONS),
            s.worker_attempt(name),
            s.dead_letter("trainer"),
            f"{api}.INFO",
            f"{api}.CONSUMER.INFO.{assign}.{consumer}",
            f"{api}.CONSUMER.CREATE.{assign}.{consumer}.{s.assign(name)}",
            f"{api}.CONSUMER.MSG.NEXT.{assign}.{consumer}",
            f"$JS.ACK.{assign}.{consumer}.>",
        ],
        # Spelled out although nothing above allows them, so that a later, wider allow entry
        # cannot open them by accident.
        publish_deny=[
            s.submit,
            s.assign(),
            s.job_event(),
            "$KV.>",
            f"{api}.STREAM.>",
            f"{api}.DIRECT.>",
            f"{api}.CONSUMER.DURABLE.CREATE.>",
        ],
        subscribe_allow=[
            f"{Subjects.worker_inbox(name)}.>",
            s.assign(name),
            s.worker_cancel(name),
            s.release(name),
            s.benchmark(name),
            s.worker_session(name),
        ],
        subscribe_deny=[s.job_event(), s.cancel(), s.submit],
        allow_responses=True,
    )
