"""The NATS broker every service uses: credentials, reconnects and dead-lettering in one place."""

from __future__ import annotations

import json
import logging
import ssl
from typing import Any

from faststream import ExceptionMiddleware
from faststream.nats import NatsBroker, NatsMessage
from faststream.nats.security import (
    NatsCredentials,
    NatsNKey,
    NatsSecurity,
    NatsToken,
    NatsUserPassword,
    parse_security,
)
from nats.aio.client import Client
from nats.aio.msg import Msg
from pydantic import ValidationError

from swarm_contracts.envelope import envelope
from swarm_contracts.events import JobEvent
from swarm_contracts.providers import ATTEMPT_TOKEN_HEADER, read_credentials
from swarm_contracts.subjects import Subjects
from swarm_runtime.settings import Settings

log = logging.getLogger(__name__)


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The client side of TLS to NATS (``SWARM_NATS_TLS_CA``/``_CERT``/``_KEY``), or None when
    none is set (a ``tls://`` URL then still gets TLS, checked against the system's CAs).

    The server's certificate is always verified, host name included; the client certificate
    is for a server that verifies clients (``verify: true`` in its ``tls`` block)."""
    if not (settings.nats_tls_ca or settings.nats_tls_cert or settings.nats_tls_key):
        return None
    if bool(settings.nats_tls_cert) != bool(settings.nats_tls_key):
        raise ValueError("SWARM_NATS_TLS_CERT and SWARM_NATS_TLS_KEY go together")
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH,
        cafile=str(settings.nats_tls_ca) if settings.nats_tls_ca else None,
    )
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if settings.nats_tls_cert and settings.nats_tls_key:
        context.load_cert_chain(str(settings.nats_tls_cert), str(settings.nats_tls_key))
    return context


def _security(settings: Settings) -> NatsSecurity | None:
    tls = tls_context(settings)
    if settings.provider_creds_file:
        # A provider's agent: its own nkey user, whatever else the environment says.
        seed = read_credentials(settings.provider_creds_file).nkey_seed
        return NatsNKey.from_seed(seed, ssl_context=tls)
    if settings.nats_user:
        password = settings.nats_password.get_secret_value() if settings.nats_password else ""
        return NatsUserPassword(settings.nats_user, password, ssl_context=tls)
    if settings.nats_token:
        return NatsToken(settings.nats_token.get_secret_value(), ssl_context=tls)
    if settings.nats_nkey_seed_file:
        return NatsNKey(settings.nats_nkey_seed_file, ssl_context=tls)
    if settings.nats_creds_file:
        # A .creds file (user JWT + nkey seed, as `nsc` writes it): operator mode.
        return NatsCredentials(str(settings.nats_creds_file), ssl_context=tls)
    if tls is not None:
        return NatsSecurity(ssl_context=tls)  # TLS alone (client certificates as identity)
    return None


def inbox_prefix(settings: Settings, service: str) -> str:
    """The inbox prefix of this identity's connections: its replies, JetStream deliveries and
    KV watches arrive under it, and its NATS user may subscribe under it only
    (deploy/nats/nats-auth.conf, ``swarm_contracts.providers``), so that no identity reads
    another's. A provider's agent is its provider; a service is its service name (also its
    NATS user's name)."""
    if settings.provider_creds_file:
        return Subjects.worker_inbox(read_credentials(settings.provider_creds_file).provider)
    return Subjects.service_inbox(service)


def connect_options(settings: Settings, service: str) -> dict[str, Any]:
    """``nats.connect`` keyword arguments for the same identity, inbox prefix and TLS as the
    broker's, for a plain nats-py connection made where no broker runs (a trainer's Ray worker
    processes)."""
    return {
        **parse_security(_security(settings)),
        "inbox_prefix": inbox_prefix(settings, service),
    }


async def dead_letter(
    connection: Client, subjects: Subjects, service: str, raw: Msg, body: bytes, exc: Exception
) -> None:
    """Park a message that cannot be parsed on ``swarm.dlq.<service>``, with the error.

    A message that can never be parsed would otherwise be redelivered forever; this way the
    service keeps running, nothing is lost, and an operator can read and replay it.
    """
    error = str(exc).replace("\n", " ")[:1000]
    log.warning("dead-lettering message on %s: %s", raw.subject, error)
    await connection.jetstream().publish(
        subjects.dead_letter(service),
        body,
        headers={"Swarm-Original-Subject": raw.subject, "Swarm-Error": error},
    )
    if raw.reply and not raw.reply.startswith("$JS.ACK."):
        # A malformed request still gets an answer, so its caller does not time out.
        refusal = {"ok": False, "error": error, "code": "invalid"}  # a swarm_contracts Reply
        await connection.publish(raw.reply, json.dumps(refusal).encode())


def dead_letter_middleware(service: str, subjects: Subjects) -> ExceptionMiddleware:
    """FastStream's side of ``dead_letter``: the message is parked, then acked."""
    middleware = ExceptionMiddleware()

    async def park(exc: Exception, message: NatsMessage) -> None:
        raw = message.raw_message
        await dead_letter(raw._client, subjects, service, raw, message.body, exc)

    middleware.add_handler(ValidationError)(park)
    middleware.add_handler(json.JSONDecodeError)(park)
    middleware.add_handler(UnicodeDecodeError)(park)
    return middleware


def make_broker(settings: Settings, service: str) -> NatsBroker:
    subjects = Subjects(settings.namespace)
    return NatsBroker(
        settings.nats_url,
        name=f"swarm-{service}",
        security=_security(settings),
        inbox_prefix=inbox_prefix(settings, service),
        # Services must outlive a NATS restart: reconnect for ever rather than exit.
        max_reconnect_attempts=-1,
        reconnect_time_wait=1,
        middlewares=[dead_letter_middleware(service, subjects)],
    )


async def publish_job_event(
    broker: NatsBroker,
    subjects: Subjects,
    service: str,
    event: JobEvent,
    *,
    msg_id: str | None = None,
    attempt_token: str | None = None,
    worker_id: str | None = None,
) -> None:
    """Publish a job event, in its CloudEvents envelope, to a replayable stream.

    The scheduler's own events go to the public events stream (``job_event``); a worker's
    (``worker_id``) go to its own subject on the workers' events stream, which the scheduler
    reads: it applies and republishes an event only if the worker holds the job's current
    attempt and ``attempt_token`` is that attempt's. ``msg_id`` becomes ``Nats-Msg-Id`` so
    that a retried publish is stored once.
    """
    headers = {"Nats-Msg-Id": msg_id} if msg_id else {}
    if attempt_token:
        headers[ATTEMPT_TOKEN_HEADER] = attempt_token
    if worker_id is None:
        subject, stream = subjects.job_event(event.job_id, event.event), subjects.events_stream
    else:
        subject = subjects.worker_event(worker_id, event.job_id, event.event)
        stream = subjects.worker_events_stream
    await broker.publish(
        envelope(service, f"swarm.job.{event.event}", event, subject=event.job_id),
        subject,
        stream=stream,
        headers=headers or None,
    )
