"""A durable consumer that hands out its messages in stream order, each once.

A service's answers depend on the order its core sees events, and replay feeds a core the recorded
stream in sequence order; so a live service must see them in that order too. A plain durable pull
consumer breaks it in two ways:

- a message delivered while the server or the connection went away (a pull reply in flight) counts
  as delivered: later messages come first and the missing one only after `ack_wait`;
- a message handled but whose acknowledgement was lost comes again.

`InOrderConsumer` keeps the stream sequence of the last message it handed out and the consumer's
delivery sequence (JetStream numbers every delivery; a jump means a delivery that never arrived).
At a jump it hands out what came before, then re-creates the consumer starting at the message after
the last one handed out, so the missing messages come at once and before newer ones. A message at or
before the last one handed out is acknowledged and dropped. A bus that numbers no deliveries (the
in-memory bus, which loses none) only gets the second rule.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Sequence, TypeVar

from .base import Bus, Consumer, Delivery

log = logging.getLogger(__name__)

REOPEN_TRIES = 60  # about two minutes: the server may be away again
T = TypeVar("T")


async def reopen_retrying(open_again: Callable[[], Awaitable[T]], what: str) -> T:
    """Re-create a consumer, retrying for about two minutes: the server that lost the deliveries may be
    away again; it comes back, or the last error is raised."""
    delay = 0.25
    for attempt in range(REOPEN_TRIES):
        try:
            return await open_again()
        except Exception as exc:  # noqa: BLE001 - any failure to reach the server is retried alike
            if attempt == REOPEN_TRIES - 1:
                raise
            log.warning("%s failed (%s); retrying", what, exc)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 2.0)
    raise AssertionError("unreachable")


class InOrderConsumer(Consumer):
    def __init__(self, bus: Bus, durable: str, subjects: Sequence[str], *, ack_wait: float = 30.0) -> None:
        self.bus = bus
        self.durable = durable
        self.subjects = tuple(subjects)
        self.ack_wait = ack_wait
        self._consumer: Consumer | None = None
        self.last_seq = 0
        """Stream sequence of the last message handed out (at open: the acknowledged floor)."""
        self._delivered = 0  # the consumer's delivery sequence of the last message received
        self.reopened = 0
        """How often the consumer was re-created at a missing delivery."""
        self.dropped = 0
        """Messages received again after they were handed out (acknowledged, not handed out)."""

    async def open(self, start_seq: int | None = None) -> InOrderConsumer:
        self._consumer = await self.bus.consumer(self.durable, self.subjects, ack_wait=self.ack_wait,
                                                 start_seq=start_seq)
        self._delivered = 0
        if start_seq is None:
            self.last_seq = await self._consumer.ack_floor()
        return self

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            raise RuntimeError("InOrderConsumer used before open()")
        return self._consumer

    async def fetch(self, batch: int = 256, timeout: float = 1.0) -> list[Delivery]:
        out: list[Delivery] = []
        for d in await self.consumer.fetch(batch, timeout):
            if d.consumer_seq:
                if d.consumer_seq > self._delivered + 1:
                    await self._reopen(d)
                    return out
                self._delivered = d.consumer_seq
            if d.seq <= self.last_seq:
                self.dropped += 1
                await d.ack()
                continue
            self.last_seq = d.seq
            out.append(d)
        return out

    async def _reopen(self, seen: Delivery) -> None:
        first = self.last_seq + 1
        log.warning("%s: deliveries %d..%d never arrived (the server or the connection went away with them in "
                    "flight): fetching again from message %d", self.durable, self._delivered + 1,
                    seen.consumer_seq - 1, first)
        self.reopened += 1
        await self.consumer.close()
        await reopen_retrying(lambda: self.open(start_seq=first), f"{self.durable}: fetching again from message {first}")

    async def lag(self) -> int | None:
        return await self.consumer.lag()

    async def ack_floor(self) -> int:
        return await self.consumer.ack_floor()

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.close()


async def in_order(bus: Bus, durable: str, subjects: Sequence[str], *, ack_wait: float = 30.0) -> InOrderConsumer:
    """Open a durable consumer on `subjects` that hands out messages in stream order, each once."""
    return await InOrderConsumer(bus, durable, subjects, ack_wait=ack_wait).open()
