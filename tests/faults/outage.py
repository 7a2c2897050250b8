"""NATS unreachable for a while: a real agent trains a job (the example trainer on the CPU), the
nats-server is stopped, kept down for `outage_s`, and started again on the same store and port.

The job is long enough never to end on its own during the test. Once the server is back and the log holds
every iteration the job made before it came back, its owner cancels it (`job.cancel`): the policy withdraws
it, the agent stops the training, which checkpoints and exits, and the agent says where it stopped
(`job.preempted`, reason `cancelled`). That ends the run without waiting out a fixed number of iterations, and
it sends a decision back down to the agent and an answer up again through the restarted server.

Checked: the agent lived through it and training went on while the server was down (the job's
status file advanced); the reporter buffered, so every iteration up to the one the job stopped at is in the
log exactly once afterwards; the job ended as its owner asked; and the log passes the matrix's checks (every
acknowledged event once, the state folded from the log equals the live one, `rubick replay` verifies)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.eventlog import events as log_events
from controlplane.events import JobSubmitted, ModelRef, Plan, Resources, decode, make
from controlplane.events.payloads import JobControl

from controlplane.lease import DEFAULT_TTL_S

from .harness import Deployment, Outcome

OUTAGE_ENV = "RUBICK_FAULT_OUTAGE_S"
DEFAULT_OUTAGE_S = 60.0
JOB = "gpt2-long"
TENANT = "team-a"
ITERATIONS = 10**6
"""The job's iterations: far more than it can make while the test runs (it ends when its owner cancels it)."""
GBS = 64
"""The job's global batch size: large enough that a minute's iterations fit the reporter's buffer."""
PACE_S = 1.0
"""The least wall time of one of the job's iterations (`rubick agent --min-iteration-s`): the trainer sleeps the rest
of it, so that through the minute it trains on a share of the machine instead of all of it."""


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
    trained_after: int = 0
    """Iterations the log holds that the job made after the server was back."""
    agent_alive: bool = False
    reported: list[int] = field(default_factory=list)
    reported_at: list[float] = field(default_factory=list)
    """The times of the job's `metrics.iteration` events in the log, in the order of their iterations."""
    stopped_at: int = -1
    """The iterations the job had done when it stopped, as the agent said (`job.preempted`); -1: it did not say."""
    stop_reason: str = ""

    @property
    def survived(self) -> bool:
        return (super().survived and self.agent_alive and self.trained_during > 0 and self.trained_after > 0
                and self.stopped_at > 0 and self.stop_reason == "cancelled"
                and self.reported == list(range(self.stopped_at)))


def submission(job_id: str, target: int):
    job = JobSubmitted(job_id=job_id, tenant=TENANT, guaranteed=True, model=ModelRef(type="gpt2"),
                       global_batch_size=GBS, plan=Plan(dp=1), resources=Resources(gpus=1), target_iterations=target)
    return make("job.submitted", job, time=time.time(), id=f"sub-{job_id}", source="test")


def cancellation(job_id: str):
    return make("job.cancel", JobControl(job_id=job_id, tenant=TENANT, reason="the outage test is over"),
                time=time.time(), id=f"cancel-{job_id}", source="test")


def iteration_of(state_dir: Path, job_id: str) -> int:
    try:
        return int(json.loads((state_dir / "jobs" / job_id / "status.json").read_text()).get("iteration") or 0)
    except (OSError, ValueError):
        return 0


async def run_outage(tmp: Path, outage_s: float) -> OutageOutcome:
    """Deploy with a real agent, train a long job, take NATS away for `outage_s`, bring it back, wait until the
    log has caught up with the training, cancel the job, check."""
    d = Deployment(tmp, agent=True, lease_ttl=DEFAULT_TTL_S, agent_args=("--min-iteration-s", str(PACE_S)))
    outcome = OutageOutcome("nats unreachable")
    await d.start()
    try:
        await d.publish(submission(JOB, ITERATIONS))
        rate = await training_rate(d.agent_state, JOB)
        server = d.nats.servers[0]
        before = iteration_of(d.agent_state, JOB)
        t0 = time.monotonic()
        server.stop()
        while time.monotonic() - t0 < outage_s:
            await asyncio.sleep(0.2)
        outcome.trained_during = iteration_of(d.agent_state, JOB) - before
        outcome.agent_alive = d.procs["agent"][0].proc.poll() is None
        d.nats.restart(0)
        outcome.outage_s = time.monotonic() - t0
        back_at = iteration_of(d.agent_state, JOB)
        outcome.notes.append(f"{JOB} trained {rate:.1f} iterations/s before the outage, {outcome.trained_during} "
                             f"iterations during it; {back_at} done when the server was back")
        # every iteration made before the server was back, and a few after, are in the stream before the cancel
        want = back_at + max(3, int(rate))
        got = await job_events(d, "metrics.iteration", JOB, lambda ps: any(p.iteration >= want for p in ps),
                               timeout=outage_s + 120)
        caught_up = max((p.iteration for p in got), default=-1)
        if caught_up < want:
            raise AssertionError(f"the stream holds {JOB}'s iterations up to {caught_up}, not {want}, after the outage")
        outcome.trained_after = caught_up - back_at
        await d.publish(cancellation(JOB))
        stopped = await job_events(d, "job.preempted", JOB, bool, timeout=120)
        if stopped:
            outcome.stopped_at, outcome.stop_reason = stopped[0].iterations_done, stopped[0].reason
        await d.stop_agent()
        last = await d.settled()
        await d.check(outcome, last)
        mine = sorted((e.payload.iteration, e.time) for e in log_events(d.log).events
                      if e.base == "metrics.iteration" and e.payload.job_id == JOB)
        outcome.reported, outcome.reported_at = [i for i, _ in mine], [t for _, t in mine]
        outcome.recover_s = outcome.outage_s
    finally:
        await d.stop()
    return outcome


async def training_rate(state_dir: Path, job_id: str, timeout: float = 240.0) -> float:
    """Iterations per second of the job once it trains (from its status file)."""
    deadline = time.monotonic() + timeout
    while iteration_of(state_dir, job_id) < 5:
        if time.monotonic() > deadline:
            raise AssertionError(f"{job_id} did not start training")
        await asyncio.sleep(0.2)
    first, t = iteration_of(state_dir, job_id), time.monotonic()
    await asyncio.sleep(2.0)
    return (iteration_of(state_dir, job_id) - first) / (time.monotonic() - t)


async def job_events(d: Deployment, subject: str, job_id: str, enough, timeout: float) -> list:
    """The payloads of the job's `subject` events in the stream, read on from where the last read ended until
    `enough(payloads)` holds or `timeout` passes (the server may still be coming back: a failed read is tried
    again)."""
    deadline, start, seen = time.monotonic() + timeout, 1, []
    while True:
        try:
            async for m in d.bus.read((f"{subject}.>",), start_seq=start):
                start = m.seq + 1
                e = decode(m.data, m.subject)
                if e.payload.job_id == job_id:
                    seen.append(e.payload)
        except Exception:
            pass
        if enough(seen) or time.monotonic() > deadline:
            return seen
        await asyncio.sleep(0.5)
