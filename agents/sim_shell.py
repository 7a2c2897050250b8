"""Simulated node agents on a real bus: the `SimulatedAgents` core driven by a (sped-up) wall clock.

`rubick up --sim-cluster NxG` runs this shell beside the control plane, so a whole cluster runs on
one machine over real NATS. The core is the one the offline simulator drives (`agents/simulated.py`)
and stays pure; only this shell reads a clock:

- `SimClock` is the simulated cluster's clock: simulated seconds since the Unix epoch, starting at
  the wall-clock time of start-up and running `speed` simulated seconds per wall second.
- A delivered event is handed to the core re-timed to the clock's reading when it arrived (what a
  real agent does: it acts when a decision reaches it and stamps what it reports with its own
  clock). Before that, every timer of the core due by then is fired (`fire(now)`), so the core sees
  time only move forward, in the same order the offline simulator keeps (timers first, then inputs).
- Between deliveries the shell waits for the next message or the next timer (`due()`), whichever
  comes first; fired events carry their timer's time.

Given the same deliveries and the same clock readings the core answers the same; the wall clock is
an input of the shell, never of the core. What the shell publishes (the agents' lifecycle events and
`metrics.iteration`, the nodes' `node.registered`) is an input of the control plane, recorded like
everything else, so replaying a live run does not need to rebuild the agents.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

from controlplane import metrics
from controlplane.aio import wait_or_timeout
from controlplane.bus.base import Bus, Delivery
from controlplane.bus.inorder import in_order
from controlplane.events import Event, Invalid, NodeRegistered, decode, encode, make
from controlplane.service import publish_encoded, publish_events

from .simulated import SimulatedAgents

log = logging.getLogger(__name__)

MAX_WAIT_S = 0.25
"""Longest a fetch waits (wall seconds) before the loop looks at its timers and stop flag again."""


@dataclass
class SimClock:
    """Simulated seconds since the epoch: `origin` at start-up, then `speed` per wall second."""

    speed: float = 1.0
    origin: float = field(default_factory=time.time)
    _mono0: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if not (self.speed > 0 and math.isfinite(self.speed)):
            raise ValueError(f"speed must be a positive number, not {self.speed!r}")

    def now(self) -> float:
        return self.origin + (time.monotonic() - self._mono0) * self.speed

    def wall_until(self, t: float) -> float:
        """Wall seconds until the clock reads `t` (0 when it already does)."""
        return max(0.0, (t - self.now()) / self.speed)


def node_registrations(nodes: Sequence[NodeRegistered], t: float) -> list[Event]:
    """`node.registered` for each node at time `t`, each from its own agent."""
    return [make("node.registered", n, time=t, id=f"sim-node-{n.node}", source=f"agent-{n.node}") for n in nodes]


@dataclass
class SimAgentsShell:
    core: SimulatedAgents
    bus: Bus
    clock: SimClock
    nodes: Sequence[NodeRegistered] = ()
    """Registered (published) when the shell starts."""
    batch: int = 256
    ack_wait: float = 30.0
    handled: int = 0
    fired: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    _last_now: float = -math.inf

    @property
    def name(self) -> str:
        return self.core.name

    def _now(self) -> float:
        """The clock's reading, never behind one already handed to the core."""
        self._last_now = max(self._last_now, self.clock.now())
        return self._last_now

    async def run(self, stop: asyncio.Event) -> None:
        consumer = await in_order(self.bus, f"svc-{self.name}", self.core.subjects, ack_wait=self.ack_wait)
        try:
            if self.nodes:
                await self.publish(node_registrations(self.nodes, self._now()))
            self.ready.set()
            while not stop.is_set():
                await self.fire_due()
                due = self.core.due()
                wait = MAX_WAIT_S if due is None else min(MAX_WAIT_S, self.clock.wall_until(due))
                for d in await consumer.fetch(self.batch, timeout=wait):
                    await self.process(d)
        finally:
            await consumer.close()

    async def fire_due(self, now: float | None = None) -> None:
        """Fire every timer due by `now` (by default the clock's reading)."""
        due = self.core.due()
        if due is None:
            return
        now = self._now() if now is None else now
        if due <= now:
            try:  # a timer is taken off before it fires, so a failing one is not fired again
                out = [(e, encode(e)) for e in self.core.fire(now)]
            except Exception:  # a core bug must not stop the agents: log, go on
                log.exception("%s: firing its timers failed at %.3f", self.name, now)
                return
            self.fired += len(out)
            await publish_encoded(self.bus, self.name, out)

    async def process(self, d: Delivery) -> None:
        metrics.MESSAGES_IN.labels(self.name, metrics.subject_label(d.subject)).inc()
        try:
            event = decode(d.data, d.subject)
        except Invalid:  # admission answers it; the agents skip it
            await d.ack()
            return
        now = self._now()  # one reading for both: a timer due before the message fires before it
        await self.fire_due(now)
        try:
            out = [(e, encode(e)) for e in self.core.handle(replace(event, time=now))]
        except Exception:  # a core bug must not stop the agents: log, skip, go on
            log.exception("%s: handler failed on seq %d (%s)", self.name, d.seq, d.subject)
            out = []
        self.handled += 1
        await publish_encoded(self.bus, self.name, out)
        await d.ack()

    async def publish(self, events: list[Event]) -> None:
        await publish_events(self.bus, self.name, events)


async def run_sim_ticker(bus: Bus, clock: SimClock, period_s: float, stop: asyncio.Event) -> None:
    """`clock.tick` every `period_s` simulated seconds (ids and times as `controlplane.ticker`'s)."""
    from controlplane.ticker import tick_event

    while not stop.is_set():
        seq = int(clock.now() // period_s)
        event = tick_event(seq, period_s)
        await bus.publish(event.subject, encode(event), event.id)
        await wait_or_timeout(stop, clock.wall_until((seq + 1) * period_s))
