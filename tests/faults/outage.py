"""NATS unreachable for a while: a real agent trains a small job (the example trainer on the CPU), the
nats-server is stopped, kept down for `outage_s`, and started again on the same store and port.

Checked: the agent lived through it and training went on while the server was down (the job's
status file advanced); the reporter buffered, so every iteration is in the log exactly once afterwards;
the job completed; and the log passes the matrix's checks (every acknowledged event once, the state
folded from the log equals the live one, `rubick replay` verifies)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.eventlog import events as log_events
from controlplane.events import JobSubmitted, ModelRef, Plan, Resources, make

from controlplane.lease import DEFAULT_TTL_S

from .harness import Deployment, Outcome

OUTAGE_ENV = "RUBICK_FAULT_OUTAGE_S"
DEFAULT_OUTAGE_S = 60.0
JOB = "gpt2-long"
PROBE = "gpt2-probe"
PROBE_ITERATIONS = 100
OUTLAST = 2.0
"""The long job trains this many times the outage (and 10 s) at the probe's rate: it is still training when the server
is back, and the outage is not cut short unless the machine trains twice as fast as it did for the probe."""
GBS = 64
"""The jobs' global batch size: large enough that a minute's iterations fit the reporter's buffer."""


def outage_seconds() -> float:
    """The outage's length: $RUBICK_FAULT_OUTAGE_S (to shorten it locally), else a minute."""
    try:
        return max(1.0, float(os.environ.get(OUTAGE_ENV, DEFAULT_OUTAGE_S)))
    except ValueError:
        return DEFAULT_OUTAGE_S


@dataclass
class OutageOutcome(Outcome):
    outage_s: float = 0.0
    trained_during: int = 0
    """Iterations the job made while the server was down (from its status file)."""
    agent_alive: bool = False
    reported: list[int] = field(default_factory=list)
    completed: bool = False
    target: int = 0

    @property
    def survived(self) -> bool:
        return (super().survived and self.agent_alive and self.trained_during > 0 and self.completed
                and self.reported == list(range(self.target)))


def submission(job_id: str, target: int):
    job = JobSubmitted(job_id=job_id, tenant="team-a", guaranteed=True, model=ModelRef(type="gpt2"),
                       global_batch_size=GBS, plan=Plan(dp=1), resources=Resources(gpus=1), target_iterations=target)
    return make("job.submitted", job, time=time.time(), id=f"sub-{job_id}", source="test")


def iteration_of(state_dir: Path, job_id: str) -> int:
    try:
        return int(json.loads((state_dir / "jobs" / job_id / "status.json").read_text()).get("iteration") or 0)
    except (OSError, ValueError):
        return 0


async def run_outage(tmp: Path, outage_s: float, target: int = 0) -> OutageOutcome:
    """Deploy with a real agent, train a job of `target` iterations (0: enough to outlast the outage, at the
    rate a first short job trained), take NATS away for `outage_s` (less where
    the job would otherwise end before the server is back: `outage_s` says how long it was), bring it back,
    check."""
    d = Deployment(tmp, agent=True, lease_ttl=DEFAULT_TTL_S)
    outcome = OutageOutcome("nats unreachable")
    await d.start()
    try:
        # a first job tells how fast this machine trains (from its first iteration to its last): the long one must
        # outlast the outage
        await d.publish(submission(PROBE, PROBE_ITERATIONS))
        if not await completed(d, PROBE, timeout=300):
            raise AssertionError(f"{PROBE} did not complete")
        rate = completed_rate(d.agent_state, PROBE)
        outcome.target = target = target or int(rate * OUTLAST * (outage_s + 10))
        outcome.notes.append(f"{PROBE} trained {rate:.1f} iterations/s: {JOB} gets {target} iterations")
        await d.publish(submission(JOB, target))
        await training_rate(d.agent_state, JOB)
        server = d.nats.servers[0]
        before = iteration_of(d.agent_state, JOB)
        t0 = time.monotonic()
        server.stop()
        # the job must still train when the server is back (its reporter is then there to send what it kept)
        while time.monotonic() - t0 < outage_s and iteration_of(d.agent_state, JOB) < target - max(20, 5 * rate):
            await asyncio.sleep(0.2)
        outcome.trained_during = iteration_of(d.agent_state, JOB) - before
        outcome.agent_alive = d.procs["agent"][0].proc.poll() is None
        d.nats.restart(0)
        outcome.outage_s = time.monotonic() - t0
        outcome.completed = await completed(d, JOB, timeout=outage_s + 300)
        await d.stop_agent()
        last = await d.settled()
        await d.check(outcome, last)
        outcome.reported = sorted(e.payload.iteration for e in log_events(d.log).events
                                  if e.base == "metrics.iteration" and e.payload.job_id == JOB)
        outcome.recover_s = outcome.outage_s
    finally:
        await d.stop()
    return outcome


def completed_rate(state_dir: Path, job_id: str) -> float:
    """Iterations per second of a completed job, from its first iteration to its end (its status file)."""
    doc = json.loads((state_dir / "jobs" / job_id / "status.json").read_text())
    return (int(doc["iteration"]) - 1) / max(1e-3, float(doc["completed_at"]) - float(doc["first_iteration_at"]))


async def training_rate(state_dir: Path, job_id: str, timeout: float = 240.0) -> float:
    """Iterations per second of the job once it trains (from its status file)."""
    deadline = time.monotonic() + timeout
    while iteration_of(state_dir, job_id) < 5:
        if time.monotonic() > deadline:
            raise AssertionError(f"{job_id} did not start training")
        await asyncio.sleep(0.2)
    first, t = iteration_of(state_dir, job_id), time.monotonic()
    await asyncio.sleep(3.0)
    return (iteration_of(state_dir, job_id) - first) / (time.monotonic() - t)


async def completed(d: Deployment, job_id: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async for m in d.bus.read(("job.completed.>",)):
                if f'"{job_id}"'.encode() in m.data or job_id.encode() in m.data:
                    return True
        except Exception:
            pass
        await asyncio.sleep(0.5)
    return False
