"""The NATS broker every service uses: credentials, reconnects and dead-lettering in one place."""

from __future__ import annotations

import json
import logging

from faststream import ExceptionMiddleware
from faststream.nats import NatsBroker, NatsMessage
from faststream.nats.security import NatsCredentials, NatsNKey, NatsToken, NatsUserPassword
from nats.aio.client import Client
from nats.aio.msg import Msg
from pydantic import ValidationError

from swarm_common.envelope import envelope
from swarm_common.events import JobEvent
from swarm_common.settings import Settings
from swarm_common.subjects import Subjects

log = logging.getLogger(__name__)


def _security(
    settings: Settings,
) -> NatsUserPassword | NatsToken | NatsNKey | NatsCredentials | None:
    if settings.nats_user:
        password = settings.nats_password.get_secret_value() if settings.nats_password else ""
        return NatsUserPassword(settings.nats_user, password)
    if settings.nats_token:
        return NatsToken(settings.nats_token.get_secret_value())
    if settings.nats_nkey_seed_file:
        return NatsNKey(settings.nats_nkey_seed_file)
    if settings.nats_creds_file:
        # A .creds file (user JWT + nkey seed, as `nsc` writes it): operator mode.
        return NatsCredentials(str(settings.nats_creds_file))
    return None


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
        await connection.publish(raw.reply, json.dumps({"ok": False, "error": error}).encode())


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
) -> None:
    """Publish a job event, in its CloudEvents envelope, to the replayable events stream.

    ``msg_id`` becomes ``Nats-Msg-Id`` so that a retried publish is stored once.
    """
    await broker.publish(
        envelope(service, f"swarm.job.{event.event}", event, subject=event.job_id),
        subjects.job_event(event.job_id, event.event),
        stream=subjects.events_stream,
        headers={"Nats-Msg-Id": msg_id} if msg_id else None,
    )
