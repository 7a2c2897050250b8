"""The policy as a live service: real nats-server, the control plane of `rubick up`, then `rubick explain`."""

from __future__ import annotations


import asyncio

from controlplane.auth import Identity
from controlplane.cli import main
from controlplane.client import Client
from controlplane.eventlog import events as log_events
from controlplane.events import Plan, make
from controlplane.runtime import ControlPlane, UpConfig

from .helpers import decided, job, node


async def start(tmp_path) -> ControlPlane:
    cfg = UpConfig(data_dir=tmp_path / "rk", nats_port=0, metrics_port=-1, tick_period_s=0, roll_seconds=0.2)
    plane = await ControlPlane(cfg).start()
    await asyncio.wait_for(plane.models_ready.wait(), 60)
    return plane


async def test_live_policy_decides_restarts_from_the_stream_and_explains(tmp_path, capsys):
    plane = await start(tmp_path)
    try:
        async with await Client.connect(plane.nats_url, credentials=plane.credentials_for(Identity("admin"))) as client:
            for i in range(2):
                await client.publish(make("node.registered", node(f"n{i}"), time=float(i), id=f"node-{i}",
                                          source="test"))
            res = await client.submit(job("gpt", "gpt2", 16, Plan(dp=4, zero_stage=2), 4, 32, guaranteed=True),
                                      wait_s=0.5)
            assert res.rejected is None
        assert len(await decided(plane, 1)) >= 1
    finally:
        await plane.stop()

    plane = await start(tmp_path)  # the policy's state comes back from the stream
    try:
        async with await Client.connect(plane.nats_url, credentials=plane.credentials_for(Identity("admin"))) as client:
            await client.submit(job("vit", "vit", 64, Plan(dp=2), 2, 16), wait_s=0.5)
        rounds = await decided(plane, 2)
        assert len(rounds) >= 2
    finally:
        await plane.stop()

    log = log_events(tmp_path / "rk" / "events")
    holding: dict[str, dict[str, int]] = {}
    for e in log.events:
        if e.base == "plan.decided":
            assert e.payload.policy == "rubick"
            for d in e.payload.decisions:
                holding[d.job_id] = {s.node: s.gpus for s in d.allocation}
    assert set(holding) == {"gpt", "vit"} and all(holding.values())
    for n in ("n0", "n1"):  # the restarted policy knew what the first one had given out
        assert sum(h.get(n, 0) for h in holding.values()) <= 8

    code = main(["explain", "gpt", "--log", str(tmp_path / "rk" / "events")])
    text = capsys.readouterr().out
    assert code == 0
    assert "GPU sensitivity curve" in text and "minimum demand (min_res)" in text
    assert "plans considered on placement" in text and "chosen: fastest feasible plan" in text
    assert main(["explain", "nobody", "--log", str(tmp_path / "rk" / "events")]) == 1
