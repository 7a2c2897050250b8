"""The whole loop on the CPU: a real nats-server, `rubick agent --cpu-devices 2`, real DeepSpeed
training of the example model, and a plan change in the middle of the run
(DP=2 ZeRO-2 -> DP=1 ZeRO-Offload with GA=2), recorded in the Parquet event log."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.eventlog import scan
from controlplane.events import Plan
from controlplane.recorder.service import Recorder, RecorderConfig, stream_token

from .helpers import Watcher, decide, decision, job, kill_jobs, publish, start_agent, stop_agent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

DP2_Z2 = Plan(dp=2, zero_stage=2)
DP1_OFFLOAD_GA2 = Plan(dp=1, zero_stage=2, offload=True, ga_steps=2)
TARGET = 150


async def test_submit_decide_train_reconfigure_complete(js_bus, tmp_path):
    stop = asyncio.Event()
    recorder = Recorder(js_bus, RecorderConfig(tmp_path / "events", roll_seconds=0.3),
                        stream_token(await js_bus.stream_created()))
    rec_task = asyncio.create_task(recorder.run(stop))
    watch = await Watcher().start(js_bus)
    agent = start_agent(js_bus.nc.connected_url.geturl(), tmp_path / "agent")
    try:
        await publish(js_bus, "job.submitted", job("j1", target=TARGET))
        await decide(js_bus, decision("j1", DP2_Z2, gpus=2, cpus=2))
        await watch.until(lambda: len(watch.of("metrics.iteration", "j1")) >= 3, 180, "iterations under DP=2")
        assert [e.payload.attempt for e in watch.of("job.started", "j1")] == [1]

        # a plan this node cannot run, in the middle of the run: refused, and the job is left alone
        await decide(js_bus, decision("j1", Plan(dp=4, zero_stage=2), gpus=4), round=2)
        (rej,) = await watch.until(lambda: watch.of("plan.rejected", "j1"), 30, "plan.rejected")
        assert "more devices than the node has" in rej.payload.reason

        await decide(js_bus, decision("j1", DP1_OFFLOAD_GA2, gpus=1, cpus=1), subject="plan.decided", round=3)
        (done,) = await watch.until(lambda: watch.of("job.completed", "j1"), 240, "job.completed")
        assert done.payload.iterations == TARGET

        (reconf,) = watch.of("job.reconfigured", "j1")
        assert reconf.payload.plan == DP1_OFFLOAD_GA2 and reconf.payload.restart_cost_s > 0
        metrics = watch.of("metrics.iteration", "j1")
        plans = {e.payload.plan for e in metrics}
        assert plans == {DP2_Z2, DP1_OFFLOAD_GA2}
        iterations = sorted({e.payload.iteration for e in metrics})
        assert iterations == list(range(TARGET)), "every iteration reported once, across both plans"
        first_new = min(e.payload.iteration for e in metrics if e.payload.plan == DP1_OFFLOAD_GA2)
        assert all(e.payload.iteration < first_new for e in metrics if e.payload.plan == DP2_Z2)
        assert all(e.payload.gpus_per_node == (1,) for e in metrics if e.payload.plan == DP1_OFFLOAD_GA2)
        assert all(e.payload.fwd_s is not None and e.payload.opt_s is not None for e in metrics)
        assert not watch.of("job.failed") and not watch.of("job.preempted")
        beat = await watch.until(lambda: [e for e in watch.of("node.heartbeat") if e.time > done.time], 10)
        assert beat[-1].payload.jobs == ()
    finally:
        stop_agent(agent)
        kill_jobs(tmp_path / "agent")  # nothing left running if the test failed half-way
        await asyncio.sleep(1.0)  # the recorder's last roll
        stop.set()
        await rec_task

    frame = scan(tmp_path / "events", ["subject", "job_id", "plan"]).frame
    lifecycle = [(s, p) for s, j, p in frame.select("subject", "job_id", "plan").iter_rows()
                 if j == "j1" and s in ("job.started.n0", "job.reconfigured.n0", "job.completed.n0")]
    assert lifecycle == [("job.started.n0", DP2_Z2.code()), ("job.reconfigured.n0", DP1_OFFLOAD_GA2.code()),
                         ("job.completed.n0", None)]  # the agent speaks for its node: n0 in every subject
