"""An in-memory bus with the JetStream contract and a deterministic delivery order.

Used by unit tests, the simulator and replay. Order is the stream order; messages
due for redelivery (nak'ed, or not acked within ack_wait on the injected clock)
come before new ones, by sequence.
"""

from __future__ import annotations

import asyncio
import time as _time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Sequence

from ..aio import wait_or_timeout
from .base import Bus, Consumer, Delivery, PubAck, matches_any


@dataclass
class _Stored:
    subject: str
    data: bytes
    msg_id: str | None
    time: float


@dataclass
class _ConsumerState:
    subjects: tuple[str, ...]
    ack_wait: float
    ack_all: bool
    max_ack_pending: int
    scanned: int = 0  # messages of the log looked at so far (= highest sequence scanned)
    pending: dict[int, tuple[float, int]] = field(default_factory=dict)  # seq -> (redeliver at, deliveries)
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class MemoryBus(Bus):
    def __init__(self, clock: Callable[[], float] = _time.time, dedupe_window: float = 120.0) -> None:
        self._clock = clock
        self._window = dedupe_window
        self._log: list[_Stored] = []
        self._ids: dict[str, tuple[int, float]] = {}
        self._consumers: dict[str, _ConsumerState] = {}
        self.closed = False

    async def publish(self, subject: str, data: bytes, msg_id: str | None = None) -> PubAck:
        return self.publish_nowait(subject, data, msg_id)

    def publish_nowait(self, subject: str, data: bytes, msg_id: str | None = None) -> PubAck:
        if self.closed:
            raise ConnectionError("bus closed")
        now = self._clock()
        if msg_id is not None:
            seen = self._ids.get(msg_id)
            if seen is not None and now - seen[1] <= self._window:
                return PubAck(seq=seen[0], duplicate=True)
        self._log.append(_Stored(subject, bytes(data), msg_id, now))
        seq = len(self._log)
        if msg_id is not None:
            self._ids[msg_id] = (seq, now)
        for state in self._consumers.values():
            state.wake.set()
        return PubAck(seq=seq)

    async def consumer(self, durable: str, subjects: Sequence[str] = (">",), *, ack_wait: float = 30.0,
                       ack_all: bool = False, max_ack_pending: int = 100_000,
                       start_seq: int | None = None) -> Consumer:
        state = self._consumers.get(durable)
        if state is None or start_seq is not None:
            state = _ConsumerState(tuple(subjects), ack_wait, ack_all, max_ack_pending)
            state.scanned = max(0, (start_seq or 1) - 1)
            self._consumers[durable] = state
        else:
            # a durable keeps its position; a re-bind redelivers what was in flight
            for seq, (_, n) in list(state.pending.items()):
                state.pending[seq] = (float("-inf"), n)
        return _MemoryConsumer(self, state)

    async def read(self, subjects: Sequence[str] = (">",), start_seq: int = 1,
                   end_seq: int | None = None) -> AsyncIterator[Delivery]:
        end = len(self._log) if end_seq is None else min(end_seq, len(self._log))
        for seq in range(max(start_seq, 1), end + 1):
            m = self._log[seq - 1]
            if matches_any(subjects, m.subject):
                yield Delivery(m.subject, m.data, seq, m.msg_id, m.time)

    async def last_seq(self) -> int:
        return len(self._log)

    def messages(self) -> list[tuple[int, str, bytes]]:
        """Everything stored, in order (for tests and the simulator)."""
        return [(i + 1, m.subject, m.data) for i, m in enumerate(self._log)]

    async def close(self) -> None:
        self.closed = True
        for state in self._consumers.values():
            state.wake.set()


class _MemoryConsumer(Consumer):
    def __init__(self, bus: MemoryBus, state: _ConsumerState) -> None:
        self._bus = bus
        self._s = state

    def _deliver(self, seq: int, deliveries: int) -> Delivery:
        m = self._bus._log[seq - 1]
        self._s.pending[seq] = (self._bus._clock() + self._s.ack_wait, deliveries)

        async def ack() -> None:
            if self._s.ack_all:
                for s in [s for s in self._s.pending if s <= seq]:
                    del self._s.pending[s]
            else:
                self._s.pending.pop(seq, None)

        async def nak(delay: float = 0.0) -> None:
            if seq in self._s.pending:
                self._s.pending[seq] = (self._bus._clock() + delay, self._s.pending[seq][1])
                self._s.wake.set()

        return Delivery(m.subject, m.data, seq, m.msg_id, m.time, deliveries, ack, nak)

    def _ready(self, batch: int) -> list[Delivery]:
        s, log = self._s, self._bus._log
        now = self._bus._clock()
        out = [self._deliver(seq, n + 1) for seq, (due, n) in sorted(s.pending.items()) if due <= now][:batch]
        while len(out) < batch and s.scanned < len(log) and len(s.pending) < s.max_ack_pending:
            s.scanned += 1
            if matches_any(s.subjects, log[s.scanned - 1].subject):
                out.append(self._deliver(s.scanned, 1))
        return out

    async def fetch(self, batch: int = 256, timeout: float = 1.0) -> list[Delivery]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self._bus.closed:
                raise ConnectionError("bus closed")
            self._s.wake.clear()
            out = self._ready(batch)
            if out:
                return out
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            wait = remaining
            if self._s.pending:  # wake up for the earliest redelivery
                due = min(d for d, _ in self._s.pending.values()) - self._bus._clock()
                wait = max(0.0, min(wait, due))
            await wait_or_timeout(self._s.wake, wait)

    async def lag(self) -> int:
        log = self._bus._log
        unscanned = sum(1 for m in log[self._s.scanned:] if matches_any(self._s.subjects, m.subject))
        return len(self._s.pending) + unscanned

    async def ack_floor(self) -> int:
        if self._s.pending:
            return min(self._s.pending) - 1
        return self._s.scanned
