"""A deployment whose node agents register themselves (`rubick up` without `--sim-cluster`) records
what replay needs, across a restart of the control plane, and `rubick replay` reproduces its
decisions and simulates its day again.

The control plane runs for real (embedded nats-server, recorder, admission, modeler, policy); the two
node agents' messages (registration, measured iterations) are published over that server by the test,
as an external agent would send them: real agents training real models are tested in tests/agents,
and here only what reaches the cores matters."""

from __future__ import annotations


import asyncio
import json
import time
from pathlib import Path

from controlplane.auth import Identity
from controlplane.cli import main
from controlplane.client import Client
from controlplane.events import MetricsIteration, Plan, decode, make
from controlplane.runtime import ControlPlane, UpConfig
from replay.verify import verify

from ..policy.helpers import decided, job, node


async def run_once(data_dir: Path, policy: str, step, *, nodes: bool) -> dict:
    plane = ControlPlane(UpConfig(data_dir=data_dir, nats_port=0, metrics_port=-1, tick_period_s=0,
                                  roll_seconds=0.2, policy=policy))
    await plane.start()
    try:
        await asyncio.wait_for(plane.models_ready.wait(), 60)
        async with await Client.connect(plane.nats_url, credentials=plane.credentials_for(Identity("admin"))) as client:
            if nodes:
                for i in range(2):
                    await client.publish(make("node.registered", node(f"n{i}"), time=time.time(), id=f"node-{i}",
                                              source=f"agent-n{i}"))
            await step(plane, client)
    finally:
        await plane.stop()
    return json.loads((data_dir / "events" / "run.json").read_text())


def measured(d, i: int) -> MetricsIteration:
    return MetricsIteration(job_id=d.job_id, model_type=d.job_id.split("-")[0], iteration=i, iter_time_s=0.8 + 0.01 * i,
                            plan=d.plan, gpus_per_node=tuple(s.gpus for s in d.allocation),
                            node=d.allocation[0].node)


async def test_a_deployment_with_its_own_agents_is_replayed_across_a_restart(tmp_path, capsys):
    data_dir, log = tmp_path / "rk", tmp_path / "rk" / "events"

    async def first(plane, client) -> None:
        await client.submit(job("gpt2-a", "gpt2", 16, Plan(dp=4, zero_stage=2), 4, 32, guaranteed=True), wait_s=0.3)
        await client.submit(job("vit-b", "vit", 64, Plan(dp=2), 2, 16), wait_s=0.3)
        rounds = await decided(plane, 1, 60)
        assert rounds, "no plan.decided"
        last = {d.job_id: d for r in rounds for d in decode(r.data, r.subject).payload.decisions}
        for d in last.values():
            if d.plan is not None:
                for i in range(3):  # what the job's node agent measures
                    await client.publish(make("metrics.iteration", measured(d, i), time=time.time(),
                                              id=f"it-{d.job_id}-{i}", source=f"agent-{d.allocation[0].node}"))

    async def second(plane, client) -> None:
        before = len(await decided(plane, 0, 0))
        await client.submit(job("bert-c", "bert", 32, Plan(dp=2), 2, 16), wait_s=0.3)
        assert len(await decided(plane, before + 1, 60)) > before

    run1 = await run_once(data_dir, "rubick", first, nodes=True)
    assert run1["kind"] == "live" and run1["config"]["clock"] == "wall" and run1["config"]["cluster"] == ""
    assert run1["consumed"]["policy"] > 0 and run1["files"]
    run2 = await run_once(data_dir, "rubick", second, nodes=False)
    assert run2["stream"] == run1["stream"] and run2.get("starts") == 2 and "earlier_configs" not in run2
    assert run2["config"]["sim_clock_origin"] == run1["config"]["sim_clock_origin"]  # the first start-up
    assert run2["consumed"]["policy"] > run1["consumed"]["policy"]

    result = verify(log)
    assert result.ok, (result.problems, result.divergence)
    assert result.checked["plan.decided"] == result.plan_decided_recorded >= 2
    assert main(["replay", str(log)]) == 0
    text = capsys.readouterr().out
    assert "OK: every recorded decision was reproduced" in text, text

    # the same recorded day under another policy, on the nodes that registered in it
    assert main(["replay", str(log), "--policy", "sia", "--out", str(tmp_path / "wi")]) == 0
    summary = json.loads((tmp_path / "wi" / "summary.json").read_text())
    assert summary["config"]["policy"] == "sia" and summary["config"]["cluster"] == "2x8"
    assert summary["what_if_clock"]["clock"] == "wall"
    assert {j["job_id"]: j["status"] for j in summary["per_job"]} == {
        "gpt2-a": "completed", "vit-b": "completed", "bert-c": "completed"}
    capsys.readouterr()

    # started again under another policy: the record keeps the earlier configuration, and replay says
    # that it rebuilds the last one
    async def nothing(plane, client) -> None:
        pass

    run3 = await run_once(data_dir, "sia", nothing, nodes=False)
    assert run3["starts"] == 3 and [c["config"]["policy"] for c in run3["earlier_configs"]] == ["rubick"]
    main(["replay", str(log)])
    assert "its configuration or starting parameters changed in between" in capsys.readouterr().out


async def test_a_what_if_of_a_deployment_where_no_node_registered_says_so(tmp_path, capsys):
    async def one_job(plane, client) -> None:
        await client.submit(job("vit-x", "vit", 64, Plan(dp=2), 2, 16), wait_s=0.3)

    run = await run_once(tmp_path / "rk", "rubick", one_job, nodes=False)
    assert run["kind"] == "live" and run["consumed"]["admission"] >= 1
    log = tmp_path / "rk" / "events"
    assert main(["replay", str(log)]) == 0  # nothing decided, nothing to differ
    capsys.readouterr()
    assert main(["replay", str(log), "--policy", "sia", "--out", str(tmp_path / "wi")]) == 2
    assert "no node with GPUs registered in the run; nothing to simulate it on" in capsys.readouterr().err
    assert not (tmp_path / "wi" / "summary.json").exists()
