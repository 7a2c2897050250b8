"""The bus contract shared by the NATS JetStream bus and the in-memory bus.

- `publish(subject, data, msg_id)` stores a message once: a second publish with the
  same `msg_id` (within the de-duplication window) is acknowledged as a duplicate
  and not stored again. Returns the stream sequence.
- `publish_many` publishes a batch with acknowledgements collected at the end.
- `consumer(durable, subjects)` opens a durable pull consumer: its position survives
  reconnects and restarts; `fetch` returns messages in stream order; a message not
  acked within `ack_wait`, or `nak`ed, is delivered again. With `ack_all`, acking a
  message acknowledges every earlier one too (one ack per batch).
- `read(subjects, start_seq, end_seq)` reads stored messages without a consumer
  (used to rebuild a core's state after a restart, and by replay).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, Sequence


@dataclass(frozen=True)
class PubAck:
    seq: int
    duplicate: bool = False


@dataclass
class Delivery:
    """One delivered message."""

    subject: str
    data: bytes
    seq: int
    """Stream sequence: unique and increasing in the stream."""
    msg_id: str | None
    time: float
    """When the stream stored it (seconds since the Unix epoch; virtual time in simulation)."""
    deliveries: int = 1
    _ack: Callable[[], Awaitable[None]] | None = None
    _nak: Callable[[float], Awaitable[None]] | None = None
    consumer_seq: int = 0
    """The consumer's number for this delivery, one more for each (redeliveries too); 0 where the bus
    numbers none. A jump means a delivery that never arrived."""

    async def ack(self) -> None:
        if self._ack is not None:
            await self._ack()

    async def nak(self, delay: float = 0.0) -> None:
        if self._nak is not None:
            await self._nak(delay)


class Consumer(abc.ABC):
    @abc.abstractmethod
    async def fetch(self, batch: int = 256, timeout: float = 1.0) -> list[Delivery]:
        """Up to `batch` messages; waits at most `timeout` s when none is ready (then returns [])."""

    @abc.abstractmethod
    async def lag(self) -> int | None:
        """Messages stored but not yet acknowledged by this consumer; None when the server cannot
        say now (an outage): the number only feeds a metric, and its caller must keep running."""

    @abc.abstractmethod
    async def ack_floor(self) -> int:
        """Highest stream sequence below which every message is acknowledged."""

    async def close(self) -> None:
        return None


class Bus(abc.ABC):
    @abc.abstractmethod
    async def publish(self, subject: str, data: bytes, msg_id: str | None = None) -> PubAck: ...

    async def publish_many(self, items: Sequence[tuple[str, bytes, str | None]]) -> list[PubAck]:
        return [await self.publish(s, d, m) for s, d, m in items]

    @abc.abstractmethod
    async def consumer(self, durable: str, subjects: Sequence[str] = (">",), *, ack_wait: float = 30.0,
                       ack_all: bool = False, max_ack_pending: int = 100_000,
                       start_seq: int | None = None) -> Consumer:
        """A durable consumer. It resumes where the durable left off; with `start_seq` it starts over
        at that stream sequence instead (what it had delivered and not seen acknowledged is forgotten)."""

    @abc.abstractmethod
    def read(self, subjects: Sequence[str] = (">",), start_seq: int = 1,
             end_seq: int | None = None) -> AsyncIterator[Delivery]: ...

    @abc.abstractmethod
    async def last_seq(self) -> int:
        """Sequence of the newest stored message (0 when empty)."""

    async def close(self) -> None:
        return None


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: `*` is one token, `>` one or more trailing tokens."""
    if pattern == ">":
        return True
    p_tokens = pattern.split(".")
    s_tokens = subject.split(".")
    for i, tok in enumerate(p_tokens):
        if tok == ">":
            return len(s_tokens) > i
        if i >= len(s_tokens):
            return False
        if tok != "*" and tok != s_tokens[i]:
            return False
    return len(s_tokens) == len(p_tokens)


def matches_any(patterns: Sequence[str], subject: str) -> bool:
    return any(subject_matches(p, subject) for p in patterns)
