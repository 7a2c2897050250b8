"""What the policy core counts as a running job's progress between measurements: it runs on at its
last measured speed, stops when a round changes it (the job restarts), and resumes only once the job
reports from its new configuration."""

from __future__ import annotations

from controlplane.events import JobReconfigured, JobStarted, MetricsIteration, NodeShare, Plan

from .helpers import Clock, decisions, job, node
from .test_guarantees import core_for


def allocation(outcome) -> tuple[NodeShare, ...]:
    return tuple(NodeShare(node=n, gpus=g, cpus=cp, mem_gb=float(m)) for n, (g, cp, m) in outcome.shares.items())


def test_a_job_makes_no_progress_from_the_round_that_changes_it_until_it_reports_again():
    core = core_for("rubick")
    c = Clock()
    core.handle(c.ev("node.registered", node("n0")))
    core.handle(c.ev("job.submitted", job("a", "bert", 32, Plan(dp=8), 8, 64, iters=100_000)))
    first = core.last["a"]
    core.handle(c.ev("job.started", JobStarted(job_id="a", allocation=allocation(first), plan=first.plan)))

    def done() -> float:
        return 100_000 - core.job_in(core.state.jobs["a"], c.t).remaining_iters

    assert done() == 0  # started, not measured yet: no speed to count progress with
    core.handle(c.ev("metrics.iteration", MetricsIteration(job_id="a", model_type="bert", iteration=99,
                                                           iter_time_s=0.1, plan=first.plan,
                                                           gpus_per_node=(8,), cpus_per_gpu=8)))
    assert done() == 100
    c.t += 10.0
    assert done() == 200  # 10 s at 0.1 s an iteration

    out = core.handle(c.ev("job.submitted", job("b", "bert", 32, Plan(dp=8), 8, 64), dt=5.0))
    assert "a" in decisions(out), "the second job must change the first for this test to mean anything"
    at_change = done()
    assert at_change == 250  # counted up to the round that changed it
    c.t += 60.0  # restarting: no progress, whatever its old speed
    assert done() == at_change
    new = core.last["a"]
    core.handle(c.ev("job.reconfigured", JobReconfigured(job_id="a", allocation=allocation(new), plan=new.plan,
                                                         restart_cost_s=61.0)))
    c.t += 5.0
    assert done() == at_change  # running again, at a speed not measured yet
    core.handle(c.ev("metrics.iteration", MetricsIteration(job_id="a", model_type="bert", iteration=300,
                                                           iter_time_s=0.2, plan=new.plan,
                                                           gpus_per_node=(4,), cpus_per_gpu=8)))
    c.t += 10.0
    assert done() == 301 + 50  # the new speed from its first report on
