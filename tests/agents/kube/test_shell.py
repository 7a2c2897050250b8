"""The agent shell (bus, core, launcher) with the Kubernetes launcher, against kmock's Kubernetes emulator on
127.0.0.1 (no real API server runs here) and the in-memory bus: a job submitted and decided becomes a pod, its
Ready condition `job.started` and its exit `job.completed`; a restarted agent adopts the running pod."""

from __future__ import annotations

import asyncio
import json

from agents.kube import manifests as m
from agents.shell import AgentShell
from controlplane.bus import MemoryBus
from controlplane.events import decode, encode

from .helpers import CAPACITY, Kubelet, decided, decision, launcher, registered, submitted


async def _publish(bus, *events) -> None:
    for e in events:
        await bus.publish(e.subject, encode(e), e.id)


def _subjects(bus) -> list[str]:
    return [s for _, s, _ in bus.messages()]


async def _until(what, timeout=5.0):
    for _ in range(int(timeout / 0.02)):
        got = what()
        if got:
            return got
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out: {what}")


async def _run(server, launchers) -> None:
    bus = MemoryBus()
    kubelet = Kubelet(server)
    await _publish(bus, registered("n1"), submitted(), decided(decision()))
    lau = launcher(server)
    launchers.append(lau)
    shell = AgentShell(bus, CAPACITY, lau, heartbeat_s=0.2, poll_s=0.02)
    stop = asyncio.Event()
    task = asyncio.create_task(shell.run(stop))
    name = m.pod_name("j1", 1, 0)
    await _until(lambda: name in kubelet.pods())
    await _until(lambda: "job.started.n0" in _subjects(bus))
    # the agent goes away and comes back: the running pod is adopted, not launched again
    stop.set()
    await task
    lau.close()
    lau2 = launcher(server)
    launchers.append(lau2)
    shell2 = AgentShell(bus, CAPACITY, lau2, heartbeat_s=0.2, poll_s=0.02)
    stop2 = asyncio.Event()
    task2 = asyncio.create_task(shell2.run(stop2))
    await _until(lambda: shell2.ready.is_set())
    assert list(kubelet.pods()) == [name] and "j1" in lau2.pods
    kubelet.exit(name, 0, json.dumps({"state": "completed", "iteration": 100}))
    await _until(lambda: "job.completed.n0" in _subjects(bus))
    await _until(lambda: kubelet.pods() == {})
    stop2.set()
    await task2
    started = [decode(d, s) for _, s, d in bus.messages() if s == "job.started.n0"]
    assert len(started) == 1 and started[0].payload.attempt == 1


def test_agent_shell_runs_a_job_as_a_pod_and_adopts_it_after_a_restart(server, launchers):
    asyncio.run(_run(server, launchers))
