"""The trace simulator with a simulated network (`--network`): contention stretches iterations, the network
core's decisions are recorded and replayed, and `none` leaves every run exactly as it was."""

from __future__ import annotations

import json
import math

import pytest

from agents.fabric import Fabric, Running
from agents.simulated import SimulatedAgents
from controlplane.events import Decision, JobSubmitted, ModelRef, NodeShare, Plan, PlanDecided, make
from controlplane.events.payloads import JobNetwork, NetworkDecided
from replay.config import RunConfig
from replay.run import ground_truth, simulate, trace_inputs
from replay.verify import verify

from .conftest import ARTIFACT
from .test_simulate import jobs_of


def _fabric(parts, nodes=("n0", "n1")) -> Fabric:
    return Fabric(dict(parts.models), parts.env, parts.perf_params(),
                  tuple(nodes))


def _dp16(model: str = "gpt2") -> Running:
    return Running(model, Plan(dp=16), (NodeShare("n0", 8), NodeShare("n1", 8)), 32)


def test_jobs_sharing_nics_slow_each_other_down_and_classes_pick_who_pays(parts):
    fab = _fabric(parts)
    alone = fab.slowdowns({"a": _dp16()}, {})
    assert alone == {}  # one job alone on the network: its measured time holds
    fair = fab.slowdowns({"a": _dp16(), "b": _dp16()}, {})
    assert fair["a"] > 1.05 and fair["b"] > 1.05  # both all-reduce over the same two NICs
    ranked = fab.slowdowns({"a": _dp16(), "b": _dp16()}, {"a": 0, "b": 1})
    assert ranked["a"] < fair["a"] and ranked["b"] >= ranked["a"]  # class 0 is served first
    one_node = Running("gpt2", Plan(dp=8), (NodeShare("n0", 8),), 32)
    assert fab.slowdowns({"a": _dp16(), "c": one_node}, {}) == {}  # inside one node: no network flow


def _submit(job: str, target: int):
    return make("job.submitted", JobSubmitted(job_id=job, tenant="t", model=ModelRef(type="gpt2"), global_batch_size=32,
                                              plan=Plan(dp=16), target_iterations=target),
                time=0.0, id=f"sub-{job}", source="test")


def _decide(job: str, t: float, n: int, alloc=(NodeShare("n0", 8), NodeShare("n1", 8))):
    return make("plan.decided", PlanDecided(round=n, policy="test", decisions=(
        Decision(job_id=job, allocation=alloc, plan=Plan(dp=16) if alloc else None),)),
        time=t, id=f"dec-{n}", source="test")


def _run_until_done(agents: SimulatedAgents, start: float) -> dict[str, float]:
    done, now = {}, start
    while True:
        t = agents.due()
        if t is None:
            return done
        for e in agents.fire(t):
            if e.base == "job.completed":
                done[e.payload.job_id] = e.time


def test_a_job_speeds_up_when_the_other_leaves_and_no_iteration_is_lost(parts):
    fab = _fabric(parts)
    agents = SimulatedAgents(ground_truth(parts), restart_cost_s=0.0, sample_every_s=1e9, fabric=fab)
    for node in ("n0", "n1"):
        agents.nodes[node] = 8
    agents.handle(_submit("a", 4000))
    agents.handle(_submit("b", 1000))
    agents.handle(_decide("a", 0.0, 1))
    agents.handle(_decide("b", 0.0, 2))
    t_a = agents.jobs["a"].iter_s
    factor = fab.slowdowns({"a": _dp16(), "b": _dp16()}, {})["a"]
    done = _run_until_done(agents, 0.0)
    # b finishes after 1000 slowed iterations; a ran 1000 slowed iterations meanwhile (the same speed), then
    # its 3000 left at its own measured speed
    assert done["b"] == pytest.approx(1000 * t_a * factor, rel=1e-9)
    assert done["a"] == pytest.approx(done["b"] + 3000 * t_a, rel=1e-6)
    assert agents.slowed_s == pytest.approx(2 * 1000 * t_a * (factor - 1), rel=1e-6)


def test_network_decided_classes_reach_the_simulated_fabric(parts):
    fab = _fabric(parts)
    agents = SimulatedAgents(ground_truth(parts), restart_cost_s=0.0, sample_every_s=1e9, fabric=fab)
    assert "network.decided" in agents.subjects
    for node in ("n0", "n1"):
        agents.nodes[node] = 8
    for job in ("a", "b"):
        agents.handle(_submit(job, 1000))
    agents.handle(_decide("a", 0.0, 1))
    agents.handle(_decide("b", 0.0, 2))
    agents.handle(make("network.decided", NetworkDecided(mode="echelonflow", round=1, classes=4, decisions=(
        JobNetwork("a", 0, 0, 1.0, 0.1), JobNetwork("b", 1, 1, 1.0, 0.1))), time=0.0, id="net-1", source="network"))
    done = _run_until_done(agents, 0.0)
    assert done["a"] < done["b"]  # same work, a's flows served first


def test_none_describes_the_run_as_before(parts):
    cfg = RunConfig(policy="rubick", cluster="2x8")
    assert "network" not in cfg.to_json() and "rack_size" not in cfg.to_json()
    assert RunConfig.from_json(cfg.to_json()) == cfg
    withnet = RunConfig(policy="rubick", cluster="2x8", network="echelonflow", rack_size=2, oversubscription=2.0)
    assert RunConfig.from_json(withnet.to_json()) == withnet


@pytest.fixture(scope="module")
def networked(parts, tmp_path_factory):
    cfg = RunConfig(policy="rubick", cluster="4x4", network="echelonflow")
    jobs = jobs_of(parts, n=60)
    out_dir = tmp_path_factory.mktemp("net")
    out = simulate(cfg, trace_inputs(cfg, jobs, parts), parts, out_dir=out_dir)
    plain_cfg = RunConfig(policy="rubick", cluster="4x4")
    plain = simulate(plain_cfg, trace_inputs(plain_cfg, jobs, parts), parts)
    return out_dir, out, plain


def test_a_networked_run_records_and_replays_its_network_decisions(networked):
    out_dir, out, _ = networked
    n = out.summary["events"].get("network.decided", 0)
    assert n > 0
    run = json.loads((out_dir / "events" / "run.json").read_text())
    assert run["config"]["network"] == "echelonflow"
    result = verify(out_dir / "events")
    assert result.ok and result.checked["network.decided"] == n
    assert out.summary["network"]["mode"] == "echelonflow" and out.summary["network"]["slowed_s"] >= 0


def test_contention_never_makes_jobs_faster(networked):
    _, out, plain = networked
    assert out.summary["jobs"]["completed"] == plain.summary["jobs"]["completed"]
    slowed = out.summary["network"]["slowed_s"]
    assert slowed > 0 and math.isfinite(slowed)  # this slice has jobs sharing NICs


def test_rubick_up_runs_the_network_core_beside_the_policy(parts):
    from controlplane.runtime import UpConfig, _modeler_and_policy, deployment_config
    from replay.config import control_cores

    cfg = deployment_config(UpConfig(network="echelonflow", network_classes=2))
    assert cfg.network == "echelonflow" and cfg.network_classes == 2
    names = [c.name for c in _modeler_and_policy(control_cores(cfg, parts))]
    assert names == ["modeler", "policy", "network"]
    plain = deployment_config(UpConfig())
    assert [c.name for c in _modeler_and_policy(control_cores(plain, parts))] == ["modeler", "policy"]


def test_simulate_refuses_network_options_without_a_network(tmp_path, capsys):
    from controlplane.cli import main

    trace = tmp_path / "t.csv"
    trace.write_text((ARTIFACT / "workload-base.csv").read_text().splitlines()[0] + "\n")
    for argv, why in ((["--rack-size", "4"], "give --network too"),
                      (["--network", "fair", "--network-classes", "9"], "1 to 8"),
                      (["--network", "fair", "--oversubscription", "0.5"], "--oversubscription must be")):
        code = main(["simulate", "--trace", str(trace), "--policy", "rubick", "--out", str(tmp_path / "o"), *argv])
        assert code == 2 and why in capsys.readouterr().err
