"""The cluster-state fold."""

from __future__ import annotations

import dataclasses

from controlplane.events import (JobCompleted, JobReconfigured, JobStarted, MetricsIteration, NodeLost, NodeShare,
                                 Plan, make)
from controlplane.state import fold

from .samples import PAYLOADS, sample


def ev(subject, payload, t):
    return make(subject, payload, time=t, id=f"{subject}-{t}", source="test")


def test_job_lifecycle_and_node_loss():
    sub = PAYLOADS["job.submitted"]
    other = dataclasses.replace(sub, job_id="other-1")
    share = (NodeShare(node="node-0", gpus=2, cpus=16, mem_gb=64.0),)
    events = [
        sample("node.registered"),
        ev("job.submitted", sub, 10.0),
        ev("job.submitted", other, 11.0),
        sample("plan.decided"),
        ev("job.started", JobStarted(job_id="gpt2-0007", allocation=share, plan=Plan(dp=2)), 20.0),
        ev("job.started", JobStarted(job_id="other-1", allocation=share, plan=Plan(dp=2)), 21.0),
        ev("metrics.iteration", dataclasses.replace(PAYLOADS["metrics.iteration"], iteration=99), 30.0),
        ev("job.reconfigured", JobReconfigured(job_id="gpt2-0007", allocation=share, plan=Plan(tp=2),
                                               restart_cost_s=70.0), 40.0),
        ev("job.completed", JobCompleted(job_id="gpt2-0007", iterations=1000), 50.0),
        ev("node.lost", NodeLost(node="node-0", reason="gone"), 60.0),
    ]
    state = fold(events, known_models=["gpt2"])
    job = state.jobs["gpt2-0007"]
    assert job.status == "completed" and job.finished_at == 50.0 and job.iterations_done == 1000
    assert job.reconfigurations == 1 and job.restart_cost_s == 70.0 and job.plan == Plan(tp=2)
    assert job.decided_plan == PAYLOADS["plan.decided"].decisions[0].plan
    assert state.jobs["other-1"].status == "preempted"  # its node was lost
    assert not state.nodes["node-0"].alive and state.totals() == (0, 0, 0)
    assert state.last_round == 17 and state.time == sample("plan.decided").time  # the latest event time


def test_refused_submissions_never_become_jobs():
    sub = PAYLOADS["job.submitted"]
    state = fold([ev("job.submitted", sub, 1.0), ev("job.submitted", sub, 2.0)], known_models=["gpt2"])
    assert list(state.jobs) == ["gpt2-0007"] and state.jobs["gpt2-0007"].submitted_at == 1.0
    state = fold([ev("job.submitted", sub, 1.0)], known_models=[])
    assert state.jobs == {} and "unknown model type" in state.rejected["gpt2-0007"]


def test_fold_is_deterministic_and_incremental():
    events = [sample(s, i) for i, s in enumerate(sorted(PAYLOADS))]
    whole = fold(events, known_models=["gpt2"])
    part = fold(events[:5], known_models=["gpt2"])
    fold(events[5:], part)
    assert whole == part


def test_the_live_nodes_follow_every_node_event():
    """`alive_nodes()` and what is worked out of them (the totals, the widest node, the names) are kept between
    reads: each event that changes which nodes are alive (or what one has) must show in the next read."""
    from controlplane.events import NodeHeartbeat, NodeRegistered

    def reg(name, gpus, t, cpus=64):
        return ev("node.registered", NodeRegistered(node=name, gpus=gpus, gpu_mem_gb=80.0, cpus=cpus, mem_gb=512.0), t)

    def seen(state):
        return ([n.node for n in state.alive_nodes()], state.totals(), state.widest(), sorted(state.alive_names()),
                state.least_cpus_per_gpu())

    state = fold([reg("b", 8, 1.0), reg("a", 4, 2.0)], known_models=["gpt2"])
    assert seen(state) == (["a", "b"], (12, 128, 1024.0), 8, ["a", "b"], 8)
    fold([ev("node.lost", NodeLost(node="b", reason="gone"), 3.0)], state)
    assert seen(state) == (["a"], (4, 64, 512.0), 4, ["a"], 16)
    fold([ev("node.heartbeat", NodeHeartbeat(node="a", jobs=()), 4.0)], state)  # alive already: the same nodes
    assert seen(state) == (["a"], (4, 64, 512.0), 4, ["a"], 16)
    fold([ev("node.heartbeat", NodeHeartbeat(node="b", jobs=()), 5.0)], state)  # back
    assert seen(state) == (["a", "b"], (12, 128, 1024.0), 8, ["a", "b"], 8)
    fold([reg("b", 2, 6.0, cpus=16)], state)  # registered again with fewer GPUs and CPUs
    assert [(n.node, n.gpus) for n in state.alive_nodes()] == [("a", 4), ("b", 2)]
    assert seen(state)[1:] == ((6, 80, 1024.0), 4, ["a", "b"], 8)
    fold([reg("c", 8, 7.0)], state)
    assert seen(state) == (["a", "b", "c"], (14, 144, 1536.0), 8, ["a", "b", "c"], 8)
    fold([ev("node.lost", NodeLost(node=n, reason="gone"), 8.0) for n in "abc"], state)
    assert seen(state) == ([], (0, 0, 0), 0, [], None)


def test_the_open_jobs_are_those_jobs_in_lists_in_the_order_first_seen():
    sub = PAYLOADS["job.submitted"]
    ids = ["zeta", "alpha", "mid", "beta"]
    share = (NodeShare(node="node-0", gpus=2, cpus=16, mem_gb=64.0),)
    events = [sample("node.registered")] + [ev("job.submitted", dataclasses.replace(sub, job_id=j), 10.0 + i)
                                            for i, j in enumerate(ids)]
    events += [ev("job.started", JobStarted(job_id="mid", allocation=share, plan=Plan(dp=2)), 20.0),
               ev("job.completed", JobCompleted(job_id="alpha", iterations=1000), 30.0)]
    state = fold(events, known_models=["gpt2"])
    statuses = ("queued", "running", "preempted")
    assert [j.job_id for j in state.open_in(*statuses)] == ["zeta", "mid", "beta"]  # submission order, not by id
    assert sorted(j.job_id for j in state.open_in(*statuses)) == [j.job_id for j in state.jobs_in(*statuses)]
    assert [j.job_id for j in state.open_in("running")] == ["mid"]
    assert not state.open_in("completed")  # a job over is not open
