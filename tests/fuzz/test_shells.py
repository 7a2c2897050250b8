"""The shells under fuzzing: the service shell's process path with the real control-plane cores, the
simulated agents' shell and the node agent's delivery path, fed valid events with fields changed and
bytes that are no event at all. None of them raises, every message is acknowledged, and each core
failure of a service is answered with a `*.rejected` event on the bus."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.launcher import LocalLauncher
from agents.node import NodeCapacity
from agents.shell import AgentShell
from agents.sim_shell import SimAgentsShell, SimClock
from controlplane.bus import MemoryBus
from controlplane.bus.base import Delivery, matches_any
from controlplane.events import decode, encode
from controlplane.service import ServiceShell
from replay.config import RunConfig, control_cores, load_parts
from tests.controlplane.samples import sample
from tests.replay.test_agent import setup

from .strategies import SUBJECTS, fuzz, mutated, pack

MESSAGES = st.lists(st.one_of(mutated(), mutated(["plan.decided", "job.submitted", "metrics.iteration"]),
                              st.tuples(st.sampled_from(SUBJECTS), st.binary(max_size=30))), min_size=1, max_size=6)
PREAMBLE = [("node.registered", encode(sample("node.registered"))), ("job.submitted", encode(sample("job.submitted")))]


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return load_parts(cache_dir=tmp_path_factory.mktemp("fit"))


def _wire(cases) -> list[tuple[str, bytes]]:
    return PREAMBLE + [(wire, body if isinstance(body, bytes) else pack(body)) for wire, body in cases]


async def _deliver(process, subject: str, data: bytes, seq: int) -> None:
    acked = []

    async def ack() -> None:
        acked.append(seq)

    await process(Delivery(subject, data, seq, None, 1_700_000_000.0 + seq, _ack=ack))
    assert acked == [seq], f"seq {seq} on {subject} was not acknowledged"


async def _services(parts, messages) -> None:
    bus = MemoryBus(clock=lambda: 0.0)
    shells = [ServiceShell(c, bus, rejects=c.name == "admission")
              for c in control_cores(RunConfig(policy="rubick", cluster="2x8"), parts)]
    for seq, (subject, data) in enumerate(messages, start=1):
        for shell in shells:
            if matches_any(shell.core.subjects, subject):
                await _deliver(shell.process, subject, data, seq)
    answers = [d async for d in bus.read((">",), 1, await bus.last_seq())]
    failures = [decode(d.data, d.subject) for d in answers if d.msg_id and d.msg_id.startswith("fail-")]
    assert len(failures) == sum(s.failed for s in shells)
    assert all(f.payload.reason.startswith(f"the {f.source} service failed on it") for f in failures)


@fuzz(100)
@given(MESSAGES)
def test_service_shells_survive_anything(parts, cases):
    asyncio.run(_services(parts, _wire(cases)))


async def _sim_agents(parts, messages) -> None:
    shell = SimAgentsShell(setup(parts), MemoryBus(clock=lambda: 0.0), SimClock(speed=1000.0, origin=0.0))
    for seq, (subject, data) in enumerate(messages, start=1):
        if matches_any(shell.core.subjects, subject):
            await _deliver(shell.process, subject, data, seq)
    await shell.fire_due(10 ** 7)


@fuzz(40)
@given(MESSAGES)
def test_the_simulated_agents_shell_survives_anything(parts, cases):
    asyncio.run(_sim_agents(parts, _wire(cases)))


async def _agent(state_dir: Path, messages) -> None:
    launcher = LocalLauncher(state_dir, "node-0", None)

    def launch(action) -> None:  # a launcher failing in a way it never declared
        raise OSError("planted: no processes can start")

    launcher.launch = launch
    shell = AgentShell(MemoryBus(clock=lambda: 0.0), NodeCapacity("node-0", 8, 64, 256.0), launcher)

    async def process(d: Delivery) -> None:  # what the agent's loop does with each message
        await shell._deliver(d)
        await d.ack()

    for seq, (subject, data) in enumerate(messages, start=1):
        if matches_any(shell.core.subjects, subject):
            await _deliver(process, subject, data, seq)


@fuzz(40)
@given(MESSAGES)
def test_the_node_agent_shell_survives_anything(tmp_path, cases):
    asyncio.run(_agent(tmp_path, _wire(cases)))
