"""The discrete-event trace simulator: a virtual clock driving the real cores.

Inputs are timed events (node registrations, submissions); the loop jumps from one point in time to
the next, never stepping second by second. At each point it takes, in this order (SimPy-style
ordering by (time, priority, sequence)):

1. the simulated agents' timers due then (completions, restarts done, samples),
2. the external inputs due then, in their given order,
3. a `clock.tick` when one is due (every `tick_period_s` from time 0).

Every event is published on an in-memory stream (`MemoryBus`, whose clock is the virtual clock)
and delivered, in stream order, to every core that subscribes to its subject, in a fixed core
order; what a core answers is appended to the stream and delivered in turn. So each core sees
exactly the message sequence a live consumer of the stream would, and the run is deterministic:
ids and times come from the simulation only.

The run stops when every submitted job has finished (completed, failed or rejected) and no input
is left; when nothing can change any more (no timer, no input, and a tick changed nothing); or at
`max_time_s`.
"""

from __future__ import annotations

import time as _wall
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from controlplane.bus.memory import MemoryBus
from controlplane.events import ClockTick, Event, encode, make
from controlplane.bus.base import matches_any

from agents.simulated import SimulatedAgents


@dataclass
class SimResult:
    events: list[Event]
    """Every event in stream order (sequence = index + 1)."""
    wire: list[bytes]
    """The encoded bytes of each event, as published."""
    end_time: float
    stop_reason: str
    core_seconds: dict[str, float] = field(default_factory=dict)
    """Wall seconds spent in each core's `handle` (and the agents' timers); `simulator` = the rest."""
    wall_s: float = 0.0
    sources: dict[str, list[str]] = field(default_factory=dict)
    """Core name -> the `source` values of the events it produced."""


class Simulation:
    def __init__(self, cores: Sequence[Any], agents: SimulatedAgents, *, tick_period_s: float = 60.0,
                 max_time_s: float = 30 * 86400.0) -> None:
        if tick_period_s <= 0:
            raise ValueError("tick_period_s must be > 0")
        self.cores = [*cores, agents]
        self.agents = agents
        self.tick_period_s = float(tick_period_s)
        self.max_time_s = float(max_time_s)
        self.now = 0.0
        self.bus = MemoryBus(clock=lambda: self.now)
        self.events: list[Event] = []
        self.wire: list[bytes] = []
        self.spent = {c.name: 0.0 for c in self.cores}
        self.sources: dict[str, set[str]] = {c.name: set() for c in self.cores}
        self._routes: dict[str, list[Any]] = {}
        self._submitted: set[str] = set()
        self._finished: set[str] = set()
        self.stop_requested: str | None = None
        """Set (by a signal handler) to end the run early: it stops at the next point in time, with what it
        has simulated so far, and says why in its stop reason."""

    def _subscribers(self, base: str) -> list[Any]:
        subs = self._routes.get(base)
        if subs is None:
            subs = [c for c in self.cores if matches_any(c.subjects, base)]
            self._routes[base] = subs
        return subs

    def publish(self, first: list[Event]) -> None:
        """Put events on the stream and deliver them (and everything they cause) in stream order."""
        pending = deque(first)
        perf = _wall.perf_counter
        while pending:
            event = pending.popleft()
            if event.time != self.now:
                raise RuntimeError(f"{event.subject} {event.id} at {event.time} s published at {self.now} s: "
                                   "a core answered with another time than its input's")
            data = encode(event)
            self.bus.publish_nowait(event.subject, data)
            self.events.append(event)
            self.wire.append(data)
            base = event.base
            if base == "job.submitted":
                self._submitted.add(event.payload.job_id)
            elif base in ("job.completed", "job.failed") or (base == "job.rejected" and event.payload.job_id):
                self._finished.add(event.payload.job_id)
            for core in self._subscribers(base):
                t0 = perf()
                out = core.handle(event)
                self.spent[core.name] += perf() - t0
                if out:
                    for o in out:
                        self.sources[core.name].add(o.source)
                    pending.extend(out)

    PROGRESS_EVERY = 64
    """Time points between two calls of `run`'s progress callback."""

    def run(self, inputs: Sequence[Event], progress: Callable[[float, int, int, int], None] | None = None) -> SimResult:
        """Run to the end. `inputs` must be ordered by time. `progress`, if given, is called every
        `PROGRESS_EVERY` time points and at the end with (simulated seconds reached, events so far,
        jobs finished, jobs submitted); it only looks (display), the run does not depend on it."""
        wall0 = _wall.perf_counter()
        points = 0
        inputs = list(inputs)
        for a, b in zip(inputs, inputs[1:]):
            if b.time < a.time:
                raise ValueError(f"inputs out of time order: {b.id} at {b.time} s after {a.id} at {a.time} s")
        i, tick, agents = 0, 0, self.agents
        idle_ticks = 0
        reason = "all jobs finished"
        while True:
            if self.stop_requested:
                reason = f"stopped early ({self.stop_requested}) at {self.now:.0f} s of simulated time"
                break
            t0 = _wall.perf_counter()
            due = agents.due()  # with a simulated network, contention is worked out here
            self.spent[agents.name] += _wall.perf_counter() - t0
            next_input = inputs[i].time if i < len(inputs) else None
            next_tick = tick * self.tick_period_s
            if next_input is None and due is None:
                if self._submitted <= self._finished:
                    break
                if idle_ticks >= 2:
                    reason = "stalled: no job can make progress"
                    break
            t = min(x for x in (due, next_input, next_tick) if x is not None)
            if t > self.max_time_s:
                # the limit written out (`:g` would print 720 h as 2.592e+06 s, hiding the value)
                reason = (f"stopped at the time limit, {self.max_time_s / 3600:,.6g} h "
                          f"({self.max_time_s:,.0f} s of simulated time)")
                break
            self.now = t
            if progress is not None:
                points += 1
                if points % self.PROGRESS_EVERY == 0:
                    progress(t, len(self.events), len(self._finished), len(self._submitted))
            if due is not None and due <= t:
                t0 = _wall.perf_counter()
                fired = agents.fire(t)
                self.spent[agents.name] += _wall.perf_counter() - t0
                for e in fired:
                    self.sources[agents.name].add(e.source)
                self.publish(fired)
                idle_ticks = 0
                continue
            if next_input is not None and next_input <= t:
                j = i
                while j < len(inputs) and inputs[j].time == t:
                    j += 1
                self.publish(inputs[i:j])
                i = j
                idle_ticks = 0
                continue
            before = len(self.events)
            self.publish([make("clock.tick", ClockTick(seq=tick, period_s=self.tick_period_s), time=t,
                               id=f"tick-{tick}", source="clock")])
            tick += 1
            if next_input is None and due is None and agents.due() is None and len(self.events) == before + 1:
                idle_ticks += 1
            else:
                idle_ticks = 0
        if progress is not None:
            progress(self.now, len(self.events), len(self._finished), len(self._submitted))
        wall = _wall.perf_counter() - wall0
        spent = dict(self.spent)
        spent["simulator"] = max(0.0, wall - sum(spent.values()))
        return SimResult(self.events, self.wire, self.now, reason, spent, wall,
                         {k: sorted(v) for k, v in self.sources.items()})
