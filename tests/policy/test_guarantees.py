"""Invariants of every round, on random clusters and job mixes, and on every policy."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.events import Plan, encode
from modeler.service import make_core
from policy.engine import RubickEngine
from policy.oracle import from_modeler
from policy.registry import POLICIES, make_policy

from .helpers import ALGORITHM_ONLY, Clock, completed, decisions, job, node

MODELER = make_core()

# (model, global batch, requested plan) that run on A800s under the fitted model
CHOICES = [
    ("vit", 64, lambda g: Plan(dp=g)),
    ("roberta", 64, lambda g: Plan(dp=g, zero_stage=2)),
    ("bert", 32, lambda g: Plan(dp=g, gc=True)),
    ("t5", 16, lambda g: Plan(dp=g, zero_stage=2, offload=True)),
    ("gpt2", 16, lambda g: Plan(dp=g, zero_stage=2)),
    ("llama7", 8, lambda g: Plan(dp=g, zero_stage=2, offload=True)),
]


def core_for(policy: str, **kw):
    oracle, models = from_modeler(MODELER)
    return make_policy(policy, oracle=oracle, models=models, **{**ALGORITHM_ONLY, **kw})


def check_round(core) -> None:
    """No node over-allocated; every guaranteed job holding a guarantee is at least as fast as asked."""
    used: dict[str, list[float]] = {}
    for j in core.state.jobs.values():
        for s in j.decided_allocation:
            u = used.setdefault(s.node, [0, 0, 0.0])
            u[0] += s.gpus
            u[1] += s.cpus
            u[2] += s.mem_gb
    for name, (g, c, m) in used.items():
        n = core.state.nodes[name]
        assert n.alive, f"allocation on lost node {name}"
        assert g <= n.gpus and c <= n.cpus and m <= n.mem_gb + 1e-6, f"{name} over-allocated: {g, c, m}"
    if not isinstance(core.engine, RubickEngine):  # the baselines promise no guarantee of performance
        return
    for jid, outcome in core.last.items():
        j = core.state.jobs.get(jid)
        if j is None or not j.guaranteed or not outcome.shares or "quota" in outcome.detail or "guarantee" in outcome.detail:
            continue
        inp = core.job_in(j, core.state.time)
        ref, _ = core.engine.reference(inp)
        assert outcome.throughput >= ref * (1 - 1e-6), f"{jid}: {outcome.throughput} < guaranteed {ref}"


job_spec = st.tuples(st.integers(0, len(CHOICES) - 1), st.sampled_from([1, 2, 4, 8]), st.booleans(),
                     st.sampled_from(["a", "b"]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(st.sampled_from([4, 8]), min_size=1, max_size=4), jobs=st.lists(job_spec, min_size=1, max_size=10),
       finish=st.lists(st.integers(0, 9), max_size=4))
def test_guarantees_and_capacity_hold_on_random_clusters(nodes, jobs, finish):
    total = sum(nodes)
    core = core_for("rubick", quotas={"a": total // 2, "b": total // 4})
    c = Clock()
    for i, g in enumerate(nodes):
        core.handle(c.ev("node.registered", node(f"n{i}", gpus=g, cpus=12 * g, mem_gb=200.0 * g)))
    ids = []
    for i, (m, gpus, guaranteed, tenant) in enumerate(jobs):
        model, gbs, plan = CHOICES[m]
        gpus = min(gpus, max(nodes))
        ids.append(f"j{i}")
        core.handle(c.ev("job.submitted", job(f"j{i}", model, gbs, plan(gpus), gpus, 8 * gpus,
                                              guaranteed=guaranteed, tenant=tenant)))
        check_round(core)
    for k in finish:
        if k < len(ids) and ids[k] in core.state.jobs and core.state.jobs[ids[k]].status != "completed":
            core.handle(c.ev("job.completed", completed(ids[k])))
            check_round(core)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_runs_a_workload_within_capacity_and_deterministically(policy):
    def run():
        core = core_for(policy, quotas={"a": 8})
        c = Clock()
        out = []
        for i in range(2):
            out += core.handle(c.ev("node.registered", node(f"n{i}")))
        for i, (model, gbs, plan) in enumerate(CHOICES * 2):
            gpus = [1, 2, 4, 8][i % 4]
            out += core.handle(c.ev("job.submitted", job(f"j{i}", model, gbs, plan(gpus), gpus, 8 * gpus,
                                                         guaranteed=i % 3 == 0, tenant="a" if i % 2 else "b")))
            check_round(core)
        for i in (0, 3, 5):
            out += core.handle(c.ev("job.completed", completed(f"j{i}")))
            check_round(core)
        return out, core

    first, core = run()
    second, _ = run()
    assert [encode(e) for e in first] == [encode(e) for e in second]
    placed = [o for o in core.last.values() if o.shares]
    assert placed, f"{policy} placed nothing"
    assert all(o.plan is not None and sum(g for g, _, _ in o.shares.values()) == o.plan.gpus for o in placed)


def test_a_guaranteed_job_shrinks_best_effort_jobs_to_get_its_guarantee():
    core = core_for("rubick", quotas={"a": 8})
    c = Clock()
    core.handle(c.ev("node.registered", node("n0")))
    for i in range(3):
        core.handle(c.ev("job.submitted", job(f"be{i}", "vit", 64, Plan(dp=2), 2, 16)))
    assert sum(sum(g for g, _, _ in o.shares.values()) for o in core.last.values()) == 8  # best effort fills the node
    out = core.handle(c.ev("job.submitted", job("g", "gpt2", 16, Plan(dp=4, zero_stage=2), 4, 32, guaranteed=True, tenant="a")))
    check_round(core)
    d = decisions(out)
    assert d["g"].allocation and d["g"].reason == "guarantee"
    assert any(x.reason in ("shrunk", "preempted") for x in d.values() if x.job_id != "g")
