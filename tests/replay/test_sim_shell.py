"""The live shell of the simulated agents: what it publishes is in time order, and the core never sees
time go backwards, even when the clock moves on between firing the timers and handling a message."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from agents.sim_shell import SimAgentsShell, SimClock
from controlplane.bus import MemoryBus
from controlplane.bus.base import Delivery
from controlplane.events import JobSubmitted, ModelRef, NodeShare, Plan, Resources, decode, encode, make
from tests.replay.test_agent import decide, setup


@dataclass
class ScriptedClock(SimClock):
    """The clock's readings given in advance (the shell's only input besides the bus), then the last
    one again: the time a busy event loop lets pass between two readings is made explicit."""

    readings: tuple[float, ...] = ()
    _i: int = 0

    def now(self) -> float:
        t = self.readings[min(self._i, len(self.readings) - 1)]
        self._i += 1
        return t


def test_timers_due_before_a_message_fire_before_it_is_handled(parts):
    agents = setup(parts, target=20000)
    plan = Plan(dp=4, zero_stage=2)
    agents.handle(decide(0.0, "bert-1", (NodeShare("n0", 4, 32),), plan))
    first_sample = agents.due()  # bert-1's first measured iteration, a fraction of a second in
    assert first_sample is not None and 0 < first_sample < 5
    # the shell reads the clock just before the sample is due, and again once it is past
    clock = ScriptedClock(readings=(first_sample / 2, first_sample + 5.0))
    bus = MemoryBus(clock=lambda: 0.0)
    shell = SimAgentsShell(agents, bus, clock)
    agents.handle(make("job.submitted", JobSubmitted(job_id="bert-2", tenant="default", guaranteed=False,
                                                     model=ModelRef("bert"), global_batch_size=32, plan=plan,
                                                     resources=Resources(4, 32), target_iterations=100), time=0.5, id="sub-2", source="test"))
    msg = decide(1.0, "bert-2", (NodeShare("n1", 4, 32),), plan, rnd=2)  # its start reaches the shell late

    async def go() -> list:
        await shell.process(Delivery(msg.subject, encode(msg), 1, msg.id, 0.0))
        await shell.fire_due()
        return [decode(d.data, d.subject) async for d in bus.read()]

    out = asyncio.run(go())
    subjects = [e.subject for e in out]
    assert "metrics.iteration" in subjects and "job.started" in subjects
    times = [e.time for e in out]
    assert times == sorted(times), list(zip(subjects, times))
    sample = out[subjects.index("metrics.iteration")]
    assert sample.time == first_sample and sample.payload.job_id == "bert-1"
