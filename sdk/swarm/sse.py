"""Server-Sent Events: parsing, and the reconnect bookkeeping both clients share."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from swarm_contracts.events import MEANINGS, EventMeaning


@dataclass
class JobStreamEvent:
    """One event from an SSE stream (a job's or a sweep's): ``data`` is the whole CloudEvent."""

    id: str
    event: str
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def payload(self) -> dict[str, Any]:
        """The event's own fields (the CloudEvent's ``data``)."""
        return self.data.get("data", {})

    @property
    def meaning(self) -> EventMeaning | None:
        """What the job event means (None: not a job event, e.g. a sweep's)."""
        return MEANINGS.get(self.event)

    @property
    def terminal(self) -> bool:
        """Whether it ends a job (a sweep's stream ends with ``SWEEP_TERMINAL_EVENTS``)."""
        return self.meaning is not None and self.meaning.terminal


class SSEDecoder:
    """Feed it lines one at a time; it returns an event at each blank line that ends one."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.name, self.ident, self.data = "", "", []  # type: ignore[var-annotated]

    def feed(self, line: str) -> JobStreamEvent | None:
        if line == "":
            event = None
            if self.data:
                text = "\n".join(self.data)
                try:
                    payload = json.loads(text)
                except json.JSONDecodeError:
                    payload = {"raw": text}
                event = JobStreamEvent(id=self.ident, event=self.name or "message", data=payload)
            self._reset()
            return event
        if line.startswith(":"):
            return None  # keep-alive comment
        key, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if key == "event":
            self.name = value
        elif key == "id":
            self.ident = value
        elif key == "data":
            self.data.append(value)
        return None


@dataclass
class Resume:
    """Where a followed stream is, so that a reconnect neither loses nor repeats an event.

    ``path``: the stream (``/v1/jobs/{id}/events`` or ``/v1/sweeps/{id}/events``). A stream is
    over when the gateway ends it, never at an event the client sees: the gateway knows from the
    record whether a final event ends the job (not a replaced attempt's late one; not a
    ``succeeded`` whose verification's ``verified`` event follows), and it ends the stream only
    once the record shows the end, so a client that reads the job or sweep next sees it."""

    path: str
    last_event_id: str | None = None
    max_reconnects: int = 20
    failures: int = 0

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream"}
        if self.last_event_id:
            headers["Last-Event-ID"] = self.last_event_id
        return headers

    def seen(self, event: JobStreamEvent) -> None:
        self.failures = 0
        self.last_event_id = event.id or self.last_event_id

    def backoff(self) -> float | None:
        """Seconds to wait before reconnecting, or None when it is time to give up."""
        self.failures += 1
        if self.failures > self.max_reconnects:
            return None
        return min(0.5 * self.failures, 5.0)
