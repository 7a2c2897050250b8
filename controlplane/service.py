"""The service shell: connects a pure core to the bus.

A core is a plain object with `name`, `subjects` (what it consumes) and
`handle(event) -> list[Event]`; it reads time only from events and does no I/O.
The shell takes messages in stream order, each once (`bus.inorder`: what replay feeds a core too),
decodes, calls the core, publishes what it returns (with the event
id as `Nats-Msg-Id`, so a retry after a crash is not doubled), acknowledges,
and exports metrics (for the policy core the scheduler's too, `controlplane.scheduler_metrics`:
computed here from the core's state after each handle, never by the core). On start it
rebuilds the core's state by feeding it every stored event up to its consumer's acknowledged
position (outputs discarded), then goes on live; so a restarted service knows what it knew before.

Exactly one service per deployment (admission) answers undecodable messages
with a `*.rejected` event (`rejects=True`); the others count and skip them.

No message stops a service. A message the core raises on, or answers with
something that cannot be sent, is answered by the shell with one `*.rejected`
event naming the failure (`answers`: id `fail-<service>-<seq>`, the event's
time), acknowledged and never handled again; replay rebuilds that answer with
the same function, so it is compared byte for byte like the core's own.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from . import metrics
from .scheduler_metrics import observer_for
from .bus.base import Bus, Delivery
from .bus.inorder import in_order
from .events import Event, Invalid, Rejected, decode, encode, make, rejection_subject, unpack
from .events.codec import MAX_MESSAGE_BYTES
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


def failure_text(exc: BaseException) -> str:
    """`Type: message` of an exception on one line, without memory addresses (so a replay gives the same)."""
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", " ".join(str(exc).split()))
    return f"{type(exc).__name__}: {text}"[:400] if text else type(exc).__name__


def handler_failure(name: str, event: Event, seq: int, exc: BaseException) -> Event | None:
    """The shell's `*.rejected` answer to an event its core failed on (None for a rejection itself)."""
    subject = rejection_subject(event.subject)
    if subject is None:
        return None
    job_id = getattr(event.payload, "job_id", None)
    payload = Rejected(subject=event.subject, reason=f"the {name} service failed on it ({failure_text(exc)})",
                       event_id=event.id, job_id=job_id if isinstance(job_id, str) else None, stream_seq=seq)
    return make(subject, payload, time=event.time, id=f"fail-{name}-{seq}", source=name)


def answers(core: Core, event: Event, seq: int) -> tuple[list[tuple[Event, bytes]], Exception | None]:
    """What a shell publishes for `event` (stream sequence `seq`): the core's answers with their wire
    bytes; or, when the core raises or answers with something that cannot be sent (not an event, too
    large), the shell's `handler_failure` answer instead, with the failure. Pure, so replay rebuilds it."""
    try:
        out = [(e, encode(e)) for e in core.handle(event)]
        for e, data in out:
            if len(data) > MAX_MESSAGE_BYTES:
                raise ValueError(f"an answer on {e.subject} of {len(data):,} bytes, over the "
                                 f"{MAX_MESSAGE_BYTES:,}-byte limit of a message")
        return out, None
    except Exception as exc:  # a core bug must not stop the service or be retried for ever
        answer = handler_failure(core.name, event, seq, exc)
        return ([] if answer is None else [(answer, encode(answer))]), exc


@dataclass
class ServiceShell:
    core: Core
    bus: Bus
    rejects: bool = False
    batch: int = 256
    ack_wait: float = 30.0
    restored: int = 0
    handled: int = 0
    failed: int = 0
    """Messages the core failed on (each answered with a `*.rejected` event)."""
    seq: int = 0
    """Stream sequence of the last message this shell is done with: rebuilt from, handled, or refused."""
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    observer: object | None = None
    """What computes metrics from the core's state around each `handle()` (`before(event, live)`,
    `after(event, out)`, and `refresh()` once the state is rebuilt at start); by default the
    scheduler's for a policy core (`scheduler_metrics.observer_for`), none for the others."""

    def __post_init__(self) -> None:
        if self.observer is None:
            self.observer = observer_for(self.core)

    @property
    def name(self) -> str:
        return self.core.name

    async def restore(self, upto_seq: int) -> None:
        async for d in self.bus.read(tuple(self.core.subjects), 1, upto_seq):
            try:
                event = decode(d.data, d.subject)
            except Invalid:
                continue
            if self.observer is not None:
                self.observer.before(event, live=False)
            out = []
            try:
                out = self.core.handle(event)
            except Exception as exc:  # it failed on this event live too, and was answered then
                log.warning("%s: handler failed on seq %d while rebuilding its state (%s)", self.name, d.seq,
                            failure_text(exc))
            if self.observer is not None:
                self.observer.after(event, out)
            self.restored += 1
            self.seq = d.seq
            await asyncio.sleep(0)  # a long rebuild must not starve the lease's renewals (nor anything else)
        if self.observer is not None:
            self.observer.refresh()

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
                try:
                    answer = rejection_for(d, exc, self.name)
                except Exception as failure:  # a subject outside the catalogue's namespaces has no answer
                    log.warning("%s: cannot answer seq %d on %s (%s)", self.name, d.seq, d.subject,
                                failure_text(failure))
                    answer = None
                if answer is not None:
                    await self.publish([answer])
                log.info("%s: refused seq %d on %s: %s", self.name, d.seq, d.subject, exc)
            await d.ack()
            self.seq = d.seq
            return
        if self.observer is not None:
            self.observer.before(event)
        t0 = time.perf_counter()
        out, failure = answers(self.core, event, d.seq)
        metrics.HANDLER_SECONDS.labels(self.name).observe(time.perf_counter() - t0)
        if self.observer is not None:
            self.observer.after(event, [e for e, _ in out])
        if failure is not None:  # answered with a rejection, acknowledged: never handled again
            self.failed += 1
            metrics.MESSAGES_REJECTED.labels(self.name, label).inc()
            log.error("%s: handler failed on seq %d (%s): %s", self.name, d.seq, d.subject, failure_text(failure),
                      exc_info=failure)
        self.handled += 1
        if out:
            await publish_encoded(self.bus, self.name, out)
        await d.ack()
        self.seq = d.seq

    async def publish(self, events: list[Event]) -> None:
        await publish_events(self.bus, self.name, events)


async def publish_events(bus: Bus, name: str, events: list[Event]) -> None:
    """Publish a core's answers in order, each with its id as the dedupe id, counted per subject."""
    await publish_encoded(bus, name, [(e, encode(e)) for e in events])


async def publish_encoded(bus: Bus, name: str, events: list[tuple[Event, bytes]]) -> None:
    """`publish_events` of answers already encoded."""
    for e, data in events:
        await bus.publish(e.subject, data, e.id)
        metrics.MESSAGES_OUT.labels(name, metrics.subject_label(e.subject)).inc()
