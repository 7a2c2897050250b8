"""The shells of a replicated service: what an active replica runs, fenced by its lease.

`run_replicated` (controlplane.lease) runs a *term* while the replica holds its service's lease.
The pieces here make a term stop touching the stream as soon as the lease is no longer held:

- `LeasedBus` wraps the bus: every publish first checks the lease (and raises `LeaseLost`), and a
  long read (the state rebuild of a core at the start of a term) lets the lease's renewals run;
- `LeasedShell` checks the lease before it handles each message, so nothing is handled, answered or
  acknowledged after the lease was lost;
- `LeasedRecorder` writes (and acknowledges) a file only while the lease is held; what it had
  buffered comes again to the replica that takes over.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator, Sequence

from .bus.base import Bus, Consumer, Delivery, PubAck
from .lease import Lease, LeaseLost
from .recorder.service import Recorder
from .service import ServiceShell

YIELD_EVERY = 64
"""Messages a rebuild reads between two turns of the event loop (the lease renews in between)."""


class LeasedBus(Bus):
    def __init__(self, bus: Bus, lease: Lease) -> None:
        self.inner = bus
        self.lease = lease

    def check(self) -> None:
        if not self.lease.held():
            raise LeaseLost(f"the lease {self.lease.key!r} is no longer held by {self.lease.holder}")

    async def publish(self, subject: str, data: bytes, msg_id: str | None = None) -> PubAck:
        self.check()
        return await self.inner.publish(subject, data, msg_id)

    async def consumer(self, durable: str, subjects: Sequence[str] = (">",), *, ack_wait: float = 30.0,
                       ack_all: bool = False, max_ack_pending: int = 100_000,
                       start_seq: int | None = None) -> Consumer:
        self.check()
        return await self.inner.consumer(durable, subjects, ack_wait=ack_wait, ack_all=ack_all,
                                         max_ack_pending=max_ack_pending, start_seq=start_seq)

    async def read(self, subjects: Sequence[str] = (">",), start_seq: int = 1,
                   end_seq: int | None = None) -> AsyncIterator[Delivery]:
        n = 0
        async for d in self.inner.read(subjects, start_seq, end_seq):
            n += 1
            if n % YIELD_EVERY == 0:
                await asyncio.sleep(0)
                self.check()
            yield d

    async def last_seq(self) -> int:
        return await self.inner.last_seq()


@dataclass
class LeasedShell(ServiceShell):
    """A service shell that handles a message only while its replica holds the lease."""

    lease: Lease | None = None

    async def process(self, d: Delivery) -> None:
        if self.lease is not None and not self.lease.held():
            raise LeaseLost(f"the lease {self.lease.key!r} is no longer held by {self.lease.holder}")
        await super().process(d)


class LeasedRecorder(Recorder):
    """A recorder that writes and acknowledges only while its replica holds the lease."""

    def __init__(self, bus: Bus, config, stream: str, lease: Lease) -> None:
        super().__init__(bus, config, stream)
        self.lease = lease
        self.dropped = 0
        """Messages buffered when the lease was lost: not written, not acknowledged (they come again)."""

    async def flush(self) -> None:
        if not self.lease.held():
            self.dropped += len(self.rows)
            self.rows, self.bytes, self.last = [], 0, None
            return
        await super().flush()
