"""The `clock.tick` publisher that drives periodic work.

Tick numbers are wall time divided by the period, and each tick's message id is
`tick-<period>-<seq>`: several replicas can run and the stream keeps one tick.
"""

from __future__ import annotations

import asyncio
import time

from .aio import wait_or_timeout
from .bus.base import Bus
from .events import ClockTick, encode, make


def tick_event(seq: int, period_s: float, source: str = "clock"):
    return make("clock.tick", ClockTick(seq=seq, period_s=period_s), time=seq * period_s,
                id=f"tick-{period_s:g}-{seq}", source=source)


async def run_ticker(bus: Bus, period_s: float, stop: asyncio.Event, clock=time.time) -> None:
    while not stop.is_set():
        now = clock()
        seq = int(now // period_s)
        event = tick_event(seq, period_s)
        await bus.publish(event.subject, encode(event), event.id)
        next_at = (seq + 1) * period_s
        await wait_or_timeout(stop, next_at - clock())
