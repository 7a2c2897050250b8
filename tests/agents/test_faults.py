"""Faults with real processes: a training process killed -9, the agent killed -9 and restarted,
and malformed messages on the agent's subjects."""

from __future__ import annotations

import json
import os
import signal
import time

import msgpack
import pytest

from controlplane.events import Plan

from .helpers import Watcher, decide, decision, job, publish, start_agent, stop_agent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DP2 = Plan(dp=2, zero_stage=1)
TARGET = 400
"""Iterations of the job whose agent is killed: at about 30 a second alone on two cores (15 beside other tests), it
trains 13-27 s, and the agent is killed after its first iteration and back within a few seconds."""


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def launch_record(state_dir, job_id: str) -> dict:
    jobs = state_dir / "jobs" / job_id
    return json.loads(next(jobs.glob("launch*.json")).read_text())


async def test_training_process_killed_fails_the_job_and_frees_the_node(js_bus, tmp_path):
    state = tmp_path / "agent"
    watch = await Watcher().start(js_bus)
    agent = start_agent(js_bus.nc.connected_url.geturl(), state)
    pgids = []
    try:
        await publish(js_bus, "job.submitted", job("j1", target=100_000, plan=DP2))
        await decide(js_bus, decision("j1", DP2, gpus=2))
        await watch.until(lambda: watch.of("metrics.iteration", "j1"), 180, "iterations")
        pgids.append(launch_record(state, "j1")["pid"])
        rank0 = int((state / "jobs" / "j1" / "pids" / "rank-0").read_text())
        os.kill(rank0, signal.SIGKILL)

        (failed,) = await watch.until(lambda: watch.of("job.failed", "j1"), 60, "job.failed")
        assert failed.payload.exit_code not in (None, 0)
        assert "exited with code" in failed.payload.reason
        assert "SIGKILL" in failed.payload.log_tail or "Signal 9" in failed.payload.log_tail
        assert not group_alive(pgids[0]), "processes of the failed job are left"
        await watch.until(lambda: [e for e in watch.of("node.heartbeat") if e.time > failed.time
                                   and e.payload.jobs == ()], 10, "a heartbeat without the job")

        # malformed messages on the agent's subjects are skipped; the agent goes on
        await js_bus.publish("plan.decided.n0", b"\xc1 not msgpack")
        await js_bus.publish("plan.decided.n0", msgpack.packb({"v": 1, "id": "x", "subject": "plan.decided.n0",
                                                               "time": 1.0, "source": "t", "data": {"round": -1}}))
        # the node's two devices are free again: another job gets them
        await publish(js_bus, "job.submitted", job("j2", target=100_000, plan=DP2))
        await decide(js_bus, decision("j2", DP2, gpus=2))
        (started,) = await watch.until(lambda: watch.of("job.started", "j2"), 30, "j2 started")
        assert started.payload.allocation[0].gpus == 2
        pgids.append(launch_record(state, "j2")["pid"])
        assert agent.poll() is None
    finally:
        stop_agent(agent)
        for pgid in pgids:
            if group_alive(pgid):
                os.killpg(pgid, signal.SIGKILL)


async def test_agent_killed_and_restarted_takes_its_job_back_without_a_duplicate(js_bus, tmp_path):
    state = tmp_path / "agent"
    url = js_bus.nc.connected_url.geturl()
    watch = await Watcher().start(js_bus)
    agent = start_agent(url, state)
    pgid = None
    try:
        await publish(js_bus, "job.submitted", job("j1", target=TARGET, plan=DP2))
        await decide(js_bus, decision("j1", DP2, gpus=2))
        await watch.until(lambda: watch.of("metrics.iteration", "j1"), 180, "iterations")
        pgid = launch_record(state, "j1")["pid"]
        ranks = sorted(p.read_text() for p in (state / "jobs" / "j1" / "pids").glob("rank-*"))
        agent.send_signal(signal.SIGKILL)
        agent.wait()
        assert group_alive(pgid), "training must outlive its agent"
        killed_at = time.time()

        agent = start_agent(url, state)
        beat = await watch.until(lambda: [e for e in watch.of("node.heartbeat") if e.time > killed_at
                                          and e.payload.jobs == ("j1",)], 20, "the new agent's heartbeat with j1")
        assert beat
        (done,) = await watch.until(lambda: watch.of("job.completed", "j1"), 180, "job.completed")
        assert done.payload.iterations == TARGET
        assert [e.payload.attempt for e in watch.of("job.started", "j1")] == [1], "no second launch"
        assert sorted(p.read_text() for p in (state / "jobs" / "j1" / "pids").glob("rank-*")) == ranks
        assert not watch.of("job.failed", "j1")
        iterations = [e.payload.iteration for e in watch.of("metrics.iteration", "j1")]
        assert sorted(iterations) == list(range(TARGET))
    finally:
        stop_agent(agent)
        if pgid is not None and group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
