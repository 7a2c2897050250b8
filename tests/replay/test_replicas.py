"""Replicas of a service: an input handled again after a take-over is stored once, and a deployment of
separate `rubick service` processes survives kill -9 of its active replicas.

Two replicas of the policy and two of the recorder, as separate `rubick service` processes on a real
nats-server: kill -9 of the active ones in the middle of a bounded stream of submissions and measured
iterations. The standbys take over; the Parquet log holds every message once and every `plan.decided`
once, with no round missing; and `rubick replay` verifies the log alone (no run.json: the policy
described itself on the bus)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from controlplane.bus.nats import JetStreamBus
from controlplane.cli import main
from controlplane.eventlog import scan
from controlplane.events import MetricsIteration, Plan, encode, make
from controlplane.lease import Lease, bucket_terms, ensure_lease_bucket
from controlplane.runtime import UpConfig, model_cores
from controlplane.service import ServiceShell
from replay.config import RUN_FILE
from replay.verify import verify

from ..faults.harness import Proc
from ..policy.helpers import job, node

TTL = 2.0
T0 = time.time()
JOBS = [("vit", 64, 2), ("bert", 32, 2), ("gpt2", 16, 4), ("vit", 64, 2)] * 4


class Replica(Proc):
    """A `rubick service` process whose output lines are collected as they come."""

    def __init__(self, url: str, name: str, *extra: str) -> None:
        super().__init__(name, ["service", name, "--nats-url", url, "--log-level", "warning", *extra])

    async def said(self, *words: str, timeout: float = 60.0) -> str:
        """The first line in which this service says one of `words` (`policy ready`, `policy standby`)."""
        return await super().said(*(f"{self.name} {w}" for w in words), timeout=timeout)


async def active(lease: Lease, replicas: list[Replica], timeout: float = 30.0) -> Replica:
    """The replica whose pid is in the lease's holder now (waiting for one to hold it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        holder = await lease.holder_now()
        for r in replicas:
            if holder and f"-{r.proc.pid}-" in holder and r.proc.poll() is None:
                return r
        await asyncio.sleep(0.05)
    raise AssertionError(f"no live replica of {replicas[0].name} holds its lease")


async def settled(bus: JetStreamBus, durable: str, timeout: float = 60.0) -> None:
    """Until the durable has handled everything stored and the stream stopped growing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = await bus.last_seq()
        info = await bus.js.consumer_info(bus.stream, durable)
        if not (info.num_pending or info.num_ack_pending):
            await asyncio.sleep(0.5)
            if await bus.last_seq() == last:
                return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{durable} did not catch up with the stream")


def stream_of(i: int):
    """The i-th submission and a measured iteration of the job before it (bounded, deterministic)."""
    model, gbs, gpus = JOBS[i]
    sub = job(f"{model}-{i}", model, gbs, Plan(dp=gpus), gpus, guaranteed=i % 3 == 0)
    out = [make("job.submitted", sub, time=T0 + i, id=f"sub-{i}", source="test")]
    if i:
        pm, _, pg = JOBS[i - 1]
        it = MetricsIteration(job_id=f"{pm}-{i - 1}", model_type=pm, iteration=i, iter_time_s=0.5 + 0.01 * i,
                              plan=Plan(dp=pg), gpus_per_node=(pg,), node="n0")
        out.append(make("metrics.iteration", it, time=T0 + 0.5 + i, id=f"it-{i}", source="agent-n0"))
    return out


@pytest.mark.slow
async def test_standbys_take_over_after_kill_9_and_every_decision_is_logged_once(nats_server, tmp_path, capsys):
    url, log = nats_server.url, tmp_path / "events"
    bus = await JetStreamBus.connect(url)
    kv = await ensure_lease_bucket(bus.js, TTL)  # the deployment's bootstrap
    terms = await bucket_terms(kv)
    policy_lease = Lease(kv, "policy", "test", terms)
    recorder_lease = Lease(kv, "recorder", "test", terms)
    recorders = [Replica(url, "recorder", "--log-dir", str(log), "--roll-seconds", "0.2") for _ in range(2)]
    policies = [Replica(url, "policy") for _ in range(2)]
    everyone = recorders + policies
    try:
        for r in everyone:
            await r.said("ready", "standby")
        first_policy, first_recorder = await active(policy_lease, policies), await active(recorder_lease, recorders)
        await first_policy.said("ready")
        for i in range(2):
            n = make("node.registered", node(f"n{i}"), time=T0, id=f"node-{i}", source=f"agent-n{i}")
            await bus.publish(n.subject, encode(n), n.id)
        half = len(JOBS) // 2
        for i in range(len(JOBS)):
            if i == half:  # in the middle of the stream: the active replicas die
                for r in (first_policy, first_recorder):
                    os.kill(r.proc.pid, signal.SIGKILL)
                    r.proc.wait()
            for e in stream_of(i):
                await bus.publish(e.subject, encode(e), e.id)
            await asyncio.sleep(0.03)
        second_policy = await active(policy_lease, policies)
        second_recorder = await active(recorder_lease, recorders)
        assert second_policy is not first_policy and second_recorder is not first_recorder
        await second_policy.said("ready")
        await settled(bus, "svc-policy")
        await settled(bus, "recorder")
        last = await bus.last_seq()
    finally:
        for r in everyone:
            r.stop()
        await bus.close()

    frame = scan(log, ["subject", "msg_id"]).frame.sort("seq")
    assert frame["seq"].to_list() == list(range(1, last + 1)), "gaps or duplicate rows in the event log"
    decided = frame.filter(frame["subject"].str.starts_with("plan.decided"))["msg_id"].to_list()
    assert decided and len(decided) == len(set(decided)), "a plan.decided is in the log twice"
    rounds = sorted(int(m.rsplit("-", 1)[1]) for m in decided)
    assert rounds == list(range(rounds[0], rounds[0] + len(rounds))), f"a round is missing: {rounds}"
    described = frame.filter(frame["subject"] == "run.described")
    assert described.height >= 1 and not (log / RUN_FILE).exists()

    result = verify(log)
    assert result.ok, (result.problems, result.divergence)
    assert result.checked["plan.decided"] == result.plan_decided_recorded == len(decided)
    assert main(["replay", str(log)]) == 0
    out = capsys.readouterr().out
    assert "OK: every recorded decision was reproduced" in out and "run.described" in out, out


class DiesBeforeAcking(ServiceShell):
    """A shell that handles and answers every message but dies before acknowledging any (kill -9 between
    the publish and the ack)."""

    async def process(self, d) -> None:
        d._ack = None
        await super().process(d)


async def run_until_handled(shell: ServiceShell, count: int) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(shell.run(stop))
    deadline = time.monotonic() + 30
    while shell.handled < count and time.monotonic() < deadline and not task.done():
        await asyncio.sleep(0.02)
    stop.set()
    await task
    assert shell.handled == count


async def test_an_input_handled_again_after_a_take_over_is_answered_once(js_bus):
    """The active replica answered every input but acknowledged none: the replica that takes over is
    handed them all again, rebuilds the same answers with the same ids, and the stream stores none twice."""
    for i in range(2):
        n = make("node.registered", node(f"n{i}"), time=T0, id=f"node-{i}", source=f"agent-n{i}")
        await js_bus.publish(n.subject, encode(n), n.id)
    for i in range(6):
        for e in stream_of(i):
            await js_bus.publish(e.subject, encode(e), e.id)
    inputs = await js_bus.last_seq()
    cfg = UpConfig()

    first = DiesBeforeAcking(model_cores(cfg)[1], js_bus)
    await run_until_handled(first, inputs)
    answers = [d.msg_id async for d in js_bus.read(("plan.>", "job.rejected"), inputs + 1)]
    assert answers, "the policy answered nothing"

    second = ServiceShell(model_cores(cfg)[1], js_bus)  # a fresh core: its state comes from the stream only
    assert second.restored == 0
    await run_until_handled(second, inputs)
    again = [d.msg_id async for d in js_bus.read(("plan.>", "job.rejected"), inputs + 1)]
    assert again == answers, "an answer given again was stored again"
