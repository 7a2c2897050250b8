"""What the policy core hands the engine for a job (`PolicyCore.job_in`): every field of `JobIn`, read back by
name. `job_in` builds it positionally (it runs once per job a round), so a field put in the wrong place, or a
field added to `JobIn` without `job_in` following, must fail here: each field gets a value no other field has."""

from __future__ import annotations

import dataclasses

from controlplane.events import (ClockTick, JobStarted, MetricsIteration, ModelRef, NodeShare, Plan, Resources,
                                 JobSubmitted)
from policy.engine import JobIn

from .helpers import Clock, node
from .test_guarantees import core_for


def test_every_field_of_a_running_job_comes_from_its_own_source():
    core = core_for("rubick", hold_s=None)
    c = Clock()
    core.handle(c.ev("clock.tick", ClockTick(seq=0, period_s=60.0)))  # holds on: changed_s is counted
    core.handle(c.ev("job.submitted", JobSubmitted(  # no node yet: it waits
        job_id="a", tenant="team-z", guaranteed=True, model=ModelRef(type="bert"), global_batch_size=32,
        plan=Plan(dp=8), resources=Resources(gpus=8, cpus=64, mem_gb=48.0), target_iterations=5000, priority=3)))
    submitted_at = c.t
    core.handle(c.ev("node.registered", node("n0"), dt=2.0))  # its round places the job
    decided_at = c.t
    state = core.state.jobs["a"]
    alloc, plan = state.decided_allocation, state.decided_plan
    assert alloc and plan is not None, "the job must be placed for this test to mean anything"
    core.handle(c.ev("node.registered", node("n1")))
    assert state.decided_allocation is alloc, "the second node must not move it"
    core.handle(c.ev("job.started", JobStarted(job_id="a", allocation=alloc, plan=plan)))
    shares = {s.node: s for s in alloc}
    core.handle(c.ev("metrics.iteration", MetricsIteration(
        job_id="a", model_type="bert", iteration=39, iter_time_s=0.25, plan=plan,
        gpus_per_node=tuple(s.gpus for s in alloc), cpus_per_gpu=min(s.cpus // s.gpus for s in alloc))))
    measured_at = c.t
    core.ref_iter["a"] = 0.3  # as a first iteration run as asked would set it
    core.order["a"] = 17  # as if 17 jobs came first (0 is recent_changes's value)
    t = c.t + 7.5

    got = core.job_in(state, t)
    want = {
        "job_id": "a", "tenant": "team-z", "guaranteed": True, "order": 17,
        "requested_gpus": 8, "requested_cpus": 64, "requested_plan": Plan(dp=8), "requested_mem_gb": 48.0,
        "current": {n: (s.gpus, s.cpus) for n, s in shares.items()},
        "current_mem": {n: float(s.mem_gb) for n, s in shares.items() if s.mem_gb > 0},
        "current_plan": plan, "running": True, "priority": 3,
        "remaining_iters": 5000 - 40 - (t - measured_at) / 0.25, "target_iters": 5000.0,
        "elapsed_s": t - submitted_at, "changed_s": t - decided_at, "recent_changes": 0,
        "ref_iter_s": 0.3,
    }
    for f in dataclasses.fields(JobIn):
        if f.name == "kind":
            assert got.kind.model.name == "bert" and got.kind.global_batch == 32
            continue
        assert f.name in want, f"JobIn has a field this test does not know: {f.name} (check PolicyCore.job_in)"
        assert getattr(got, f.name) == want[f.name], f.name
    assert isinstance(got.requested_mem_gb, float) and isinstance(got.target_iters, float)
    # values no two fields share, so a swap cannot pass unseen
    plain = [v for k, v in want.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert len(plain) == len(set(plain)), want
