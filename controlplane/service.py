"""The service shell: connects a pure core to the bus.

A core is a plain object with `name`, `subjects` (what it consumes) and
`handle(event) -> list[Event]`; it reads time only from events and does no I/O.
The shell takes messages in stream order, each once (`bus.inorder`: what replay feeds a core too),
decodes, calls the core, publishes what it returns (with the event
id as `Nats-Msg-Id`, so a retry after a crash is not doubled), acknowledges,
and exports metrics. On start it rebuilds the core's state by feeding it every
stored event up to its consumer's acknowledged position (outputs discarded),
then goes on live; so a restarted service knows what it knew before.

Exactly one service per deployment (admission) answers undecodable messages
with a `*.rejected` event (`rejects=True`); the others count and skip them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from . import metrics
from .bus.base import Bus, Delivery
from .bus.inorder import in_order
from .events import Event, Invalid, Rejected, decode, encode, make, rejection_subject, unpack
from .events.catalog import is_rejection

log = logging.getLogger(__name__)


class Core(Protocol):
    name: str
    subjects: Sequence[str]

    def handle(self, event: Event) -> list[Event]: ...


def rejection_for(d: Delivery, exc: Invalid, source: str) -> Event | None:
    """The `*.rejected` answer to an undecodable message (None for a rejection itself)."""
    subject = rejection_subject(d.subject)
    if subject is None:
        return None
    event_id, job_id = "", None
    try:
        obj = unpack(d.data)
        if isinstance(obj, dict):
            event_id = obj.get("id") if isinstance(obj.get("id"), str) else ""
            data = obj.get("data")
            if isinstance(data, dict) and isinstance(data.get("job_id"), str):
                job_id = data["job_id"][:128]
    except Invalid:
        pass
    payload = Rejected(subject=d.subject, reason=exc.reason, field=exc.field, expected=exc.expected[:500],
                       got=exc.got[:500], event_id=event_id[:128], job_id=job_id, stream_seq=d.seq)
    return make(subject, payload, time=d.time, id=f"rej-seq-{d.seq}", source=source)


@dataclass
class ServiceShell:
    core: Core
    bus: Bus
    rejects: bool = False
    batch: int = 256
    ack_wait: float = 30.0
    restored: int = 0
    handled: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def name(self) -> str:
        return self.core.name

    async def restore(self, upto_seq: int) -> None:
        async for d in self.bus.read(tuple(self.core.subjects), 1, upto_seq):
            try:
                event = decode(d.data, d.subject)
            except Invalid:
                continue
            self.core.handle(event)
            self.restored += 1

    async def run(self, stop: asyncio.Event) -> None:
        consumer = await in_order(self.bus, f"svc-{self.name}", self.core.subjects, ack_wait=self.ack_wait)
        floor = consumer.last_seq
        if floor:
            await self.restore(floor)
            log.info("%s: state rebuilt from %d events up to seq %d", self.name, self.restored, floor)
        self.ready.set()
        lag_checked = 0.0
        try:
            while not stop.is_set():
                for d in await consumer.fetch(self.batch, timeout=0.25):
                    await self.process(d)
                now = time.monotonic()
                if now - lag_checked > 5.0:
                    lag_checked = now
                    lag = await consumer.lag()
                    if lag is not None:
                        metrics.CONSUMER_LAG.labels(self.name).set(lag)
        finally:
            await consumer.close()

    async def process(self, d: Delivery) -> None:
        label = metrics.subject_label(d.subject)
        metrics.MESSAGES_IN.labels(self.name, label).inc()
        try:
            event = decode(d.data, d.subject)
        except Invalid as exc:
            metrics.MESSAGES_REJECTED.labels(self.name, label).inc()
            if self.rejects and not is_rejection(d.subject):
                answer = rejection_for(d, exc, self.name)
                if answer is not None:
                    await self.publish([answer])
                log.info("%s: refused seq %d on %s: %s", self.name, d.seq, d.subject, exc)
            await d.ack()
            return
        t0 = time.perf_counter()
        try:
            out = self.core.handle(event)
        except Exception:  # a core bug must not stop the service or lose the message: log, skip, go on
            log.exception("%s: handler failed on seq %d (%s)", self.name, d.seq, d.subject)
            out = []
        metrics.HANDLER_SECONDS.labels(self.name).observe(time.perf_counter() - t0)
        self.handled += 1
        if out:
            await self.publish(out)
        await d.ack()

    async def publish(self, events: list[Event]) -> None:
        await publish_events(self.bus, self.name, events)


async def publish_events(bus: Bus, name: str, events: list[Event]) -> None:
    """Publish a core's answers in order, each with its id as the dedupe id, counted per subject."""
    for e in events:
        await bus.publish(e.subject, encode(e), e.id)
        metrics.MESSAGES_OUT.labels(name, metrics.subject_label(e.subject)).inc()
