"""What the policy does with jobs it cannot run, quotas of zero, unknown tenants and lost nodes."""

from __future__ import annotations

import pytest

from controlplane.events import JobSubmitted, ModelRef, ModelSpec, Plan, Resources
from policy.registry import make_policy

from .helpers import Clock, completed, decisions, job, lost, node
from .test_guarantees import check_round, core_for


def test_a_model_too_big_for_any_node_is_rejected_with_the_reason():
    core = core_for("rubick")
    c = Clock()
    core.handle(c.ev("node.registered", node("n0", mem_gb=100.0)))
    huge = ModelSpec(name="giant", num_params=10**13, num_layers=96, hidden_size=12288, num_heads=96, seq_len=2048,
                     global_batch_size=8, fwd_time_s=5.0)
    sub = JobSubmitted(job_id="giant-1", tenant="a", guaranteed=False, model=ModelRef(type="giant", spec=huge),
                       global_batch_size=8, plan=Plan(dp=8), resources=Resources(gpus=8), target_iterations=10)
    out = core.handle(c.ev("job.submitted", sub))
    assert [e.subject for e in out] == ["job.rejected"]
    assert out[0].payload.job_id == "giant-1"
    assert "cannot run on any node" in out[0].payload.reason
    assert "giant-1" not in core.state.jobs  # never queued silently
    # the rejection does not disturb the next job
    out = core.handle(c.ev("job.submitted", job("ok", "vit", 64, Plan(dp=2), 2, 16)))
    assert decisions(out)["ok"].allocation


def test_a_new_model_type_without_a_profiled_forward_is_rejected():
    core = core_for("rubick")
    c = Clock()
    core.handle(c.ev("node.registered", node("n0")))
    spec = ModelSpec(name="mine", num_params=10**8, num_layers=12, hidden_size=768, num_heads=12, seq_len=512,
                     global_batch_size=32)
    sub = JobSubmitted(job_id="mine-1", tenant="a", guaranteed=False, model=ModelRef(type="mine", spec=spec),
                       global_batch_size=32, plan=Plan(dp=1), resources=Resources(gpus=1), target_iterations=10)
    out = core.handle(c.ev("job.submitted", sub))
    assert out[0].subject == "job.rejected" and "rubick profile" in out[0].payload.reason


@pytest.mark.parametrize("quotas, tenant", [({"a": 0}, "a"), ({"a": 8}, "nobody")])
def test_zero_quota_or_unknown_tenant_runs_guaranteed_jobs_as_best_effort(quotas, tenant):
    core = core_for("rubick", quotas=quotas)
    c = Clock()
    core.handle(c.ev("node.registered", node("n0")))
    out = core.handle(c.ev("job.submitted", job("g", "vit", 64, Plan(dp=2), 2, 16, guaranteed=True, tenant=tenant)))
    d = decisions(out)["g"]
    assert d.allocation, "idle GPUs are still used"
    assert d.detail["quota"] in ("none", "exceeded")
    # without a guarantee it can be shrunk by a best-effort job with a steeper curve
    out = core.handle(c.ev("job.submitted", job("be", "roberta", 64, Plan(dp=1), 1, 8)))
    assert decisions(out)["be"].allocation
    check_round(core)


def test_quotas_must_be_numbers():
    with pytest.raises(ValueError):
        core_for("rubick", quotas={"a": "lots"})
    with pytest.raises(ValueError):
        core_for("nope")


def test_a_node_lost_moves_its_jobs_and_is_never_allocated_again():
    core = core_for("rubick")
    c = Clock()
    for n in ("n0", "n1"):
        core.handle(c.ev("node.registered", node(n)))
    core.handle(c.ev("job.submitted", job("a", "gpt2", 16, Plan(dp=4, zero_stage=2), 4, 32)))
    core.handle(c.ev("job.submitted", job("b", "vit", 64, Plan(dp=2), 2, 16)))
    on = {s.node for j in core.state.jobs.values() for s in j.decided_allocation}
    victim = sorted(on)[0]
    out = core.handle(c.ev("node.lost", lost(victim)))
    check_round(core)
    d = decisions(out)
    assert d, "the jobs of the lost node are decided again"
    assert all(s.node != victim for x in d.values() for s in x.allocation)
    assert any(x.reason == "node-lost" or x.allocation for x in d.values())


def test_a_round_with_no_nodes_decides_nothing_and_a_node_arriving_starts_the_queue():
    core = make_policy("rubick", **_table())
    c = Clock()
    out = core.handle(c.ev("job.submitted", job("a", "roberta", 64, Plan(dp=1), 1, 8)))
    assert [e.subject for e in out] == ["plan.pending"]  # no decision; it waits, and says why
    assert [(p.job_id, p.reason) for p in out[0].payload.pending] == [("a", "no-gpus")]
    out = core.handle(c.ev("node.registered", node("n0")))
    assert decisions(out)["a"].allocation


def _table():
    from .helpers import ENV, TABLE, models
    from policy.oracle import TableOracle
    return dict(oracle=TableOracle(env=ENV, table=TABLE), models=models("roberta"))


def _grow_after_completion(done_iterations: int, restart_cost_s: float = 78.0):
    from controlplane.events import JobStarted, MetricsIteration, NodeShare
    core = core_for("rubick", restart_cost_s=restart_cost_s)
    c = Clock()
    core.handle(c.ev("node.registered", node("n0")))
    core.handle(c.ev("job.submitted", job("a", "gpt2", 16, Plan(dp=4, zero_stage=2), 4, 32, iters=100_000)))
    core.handle(c.ev("job.submitted", job("b", "gpt2", 16, Plan(dp=4, zero_stage=2), 4, 32, iters=100_000)))
    for jid in ("a", "b"):
        st = core.state.jobs[jid]
        shares = st.decided_allocation
        core.handle(c.ev("job.started", JobStarted(job_id=jid, allocation=shares, plan=st.decided_plan)))
    a = core.state.jobs["a"]
    before = sum(s.gpus for s in a.decided_allocation)
    core.handle(c.ev("metrics.iteration", MetricsIteration(
        job_id="a", model_type="gpt2", iteration=done_iterations, iter_time_s=1.0, plan=a.decided_plan,
        gpus_per_node=tuple(s.gpus for s in a.decided_allocation), node="n0")))
    out = core.handle(c.ev("job.completed", completed("b", 100_000)))
    after = decisions(out).get("a")
    return before, (sum(s.gpus for s in after.allocation) if after else before)


def test_a_running_job_grows_only_when_the_gain_over_its_remaining_work_beats_the_restart_cost():
    before, after = _grow_after_completion(done_iterations=10)  # almost all of its work ahead: worth it
    assert after > before
    before, after = _grow_after_completion(done_iterations=99_990)  # ten iterations left: not worth 78 s
    assert after == before
    before, after = _grow_after_completion(done_iterations=10, restart_cost_s=10**9)  # a prohibitive cost
    assert after == before


def test_sia_keeps_a_job_it_cannot_run_plain_dp_on_its_requested_plan_instead_of_rejecting_it():
    core = core_for("sia")
    c = Clock()
    core.handle(c.ev("node.registered", node("n0")))
    out = core.handle(c.ev("job.submitted", job("l", "llama7", 8, Plan(dp=8, zero_stage=2, offload=True), 8, 64)))
    assert [e.subject for e in out] == ["plan.decided"]
    d = decisions(out)["l"]
    assert d.plan.offload and sum(s.gpus for s in d.allocation) == 8


def test_equal_share_never_starves_jobs_that_cannot_run_on_an_equal_split():
    """Many LLaMA-30B jobs (none runs on fewer than 24 GPUs by the table) on 64 GPUs: an equal split
    (4 GPUs each) runs none of them; `equal` gives the first ones their smallest runnable size."""
    from .helpers import table_core

    core = table_core("equal", ["llama30"])
    c = Clock()
    for i in range(8):
        core.handle(c.ev("node.registered", node(f"n{i}")))
    out = []
    for i in range(16):
        out += core.handle(c.ev("job.submitted", job(f"l{i}", "llama30", 64, Plan(pp=5, tp=2, dp=4), 40, 320)))
    out += core.handle(c.ev("clock.tick", _tick(1)))
    running = {j: d for j, d in decisions(out).items() if d.allocation}
    gpus = {j: sum(s.gpus for s in d.allocation) for j, d in running.items()}
    assert running and sum(gpus.values()) <= 64
    assert min(gpus.values()) >= 24, gpus
    assert "l0" in running  # in submission order


def _tick(seq: int):
    from controlplane.events import ClockTick
    return ClockTick(seq=seq, period_s=60.0)


def test_a_running_job_whose_best_plan_uses_fewer_gpus_keeps_its_plan_on_its_whole_allocation():
    """T5 runs PP=2, TP=8 on two full nodes; by the table one node under ZeRO-DP is faster. With
    five iterations left the change is not worth a restart: the job keeps its plan, and the plan it
    keeps matches the GPUs it holds (the check once evaluated it on the one-node placement and failed)."""
    from controlplane.events import Decision, JobStarted, MetricsIteration, NodeShare, PlanDecided
    from .helpers import make, table_core

    core = table_core("rubick", ["t5"])
    c = Clock()
    for n in ("n0", "n1"):
        core.handle(c.ev("node.registered", node(n)))
    plan = Plan(pp=2, tp=8, dp=1, micro_batches=1)
    alloc = (NodeShare(node="n0", gpus=8, cpus=32, mem_gb=0.0), NodeShare(node="n1", gpus=8, cpus=32, mem_gb=0.0))
    core.state.apply(c.ev("job.submitted", job("t", "t5", 64, plan, 16, 64, iters=1000)))
    core.state.apply(make("plan.decided", PlanDecided(round=1, policy="rubick", decisions=(
        Decision(job_id="t", allocation=alloc, plan=plan, predicted_throughput=1.0, reason="start", detail={}),)),
        time=c.t, id="given-1", source="test"))
    core.handle(c.ev("job.started", JobStarted(job_id="t", allocation=alloc, plan=plan)))
    core.handle(c.ev("metrics.iteration", MetricsIteration(job_id="t", model_type="t5", iteration=995, iter_time_s=0.6,
                                                           plan=plan, gpus_per_node=(8, 8), node="n0")))
    out = core.handle(c.ev("node.registered", node("n2")))  # a round, with nothing to take its GPUs
    check_round(core)
    t = decisions(out).get("t")
    if t is not None:
        assert t.plan.dp * t.plan.tp * t.plan.pp == sum(s.gpus for s in t.allocation)
    st = core.state.jobs["t"]
    assert st.decided_plan == plan and sum(s.gpus for s in st.decided_allocation) == 16


def test_fixed_resources_run_on_the_whole_request_even_when_fewer_gpus_would_be_faster():
    """rubick-e gives a job exactly its request. T5 asks for 16 GPUs (PP=2, TP=8); by the table it
    would be faster on one node, which the job may not shrink to: it must still start, on all 16
    (it once waited forever)."""
    from .helpers import table_core

    core = table_core("rubick-e", ["t5"])
    c = Clock()
    for n in ("n0", "n1"):
        core.handle(c.ev("node.registered", node(n)))
    out = core.handle(c.ev("job.submitted", job("t", "t5", 64, Plan(pp=2, tp=8, dp=1, micro_batches=1), 16, 64)))
    check_round(core)
    d = decisions(out)["t"]
    assert sum(s.gpus for s in d.allocation) == 16
    assert d.plan.dp * d.plan.tp * d.plan.pp == 16


def test_a_guaranteed_job_that_cannot_run_on_what_it_asks_for_is_refused_not_left_queued():
    from .helpers import table_core

    core = table_core("rubick", ("llama30", "gpt2"))
    c = Clock()
    out = []
    for e in (c.ev("node.registered", node("n0")),
              c.ev("job.submitted", job("big", "llama30", 16, Plan(dp=1), 1, guaranteed=True)),
              c.ev("job.submitted", job("fits", "gpt2", 16, Plan(dp=1), 1, guaranteed=True))):
        out += core.handle(e)
    rejected = [e.payload for e in out if e.subject == "job.rejected"]
    assert [r.job_id for r in rejected] == ["big"]
    assert "fits in memory on the 1 GPUs it asks for" in rejected[0].reason and "at least" in rejected[0].reason
    assert "big" in core.state.rejected and "fits" in core.state.jobs
