"""The simulated node agents: decisions in, lifecycle and measurements out, on measured times."""

from __future__ import annotations

import math

import pytest

from agents.simulated import SimulatedAgents
from controlplane.events import (Decision, JobSubmitted, ModelRef, NodeRegistered, NodeShare, Plan, PlanDecided,
                                 Resources, make)
from modeler.service import ModelerCore
from replay.run import ground_truth

N = 0


def ev(subject, payload, t):
    global N
    N += 1
    return make(subject, payload, time=t, id=f"t-{N}", source="test")


def decide(t, job, alloc, plan, rnd=1):
    return ev("plan.decided", PlanDecided(rnd, "test", (Decision(job, alloc, plan),)), t)


def setup(parts, target=1000, restart=78.0, sample=600.0, **kw):
    agents = SimulatedAgents(ground_truth(parts), restart_cost_s=restart, sample_every_s=sample, **kw)
    for i in range(2):
        agents.handle(ev("node.registered", NodeRegistered(f"n{i}", 8, 80.0, 96, 1600.0), 0.0))
    sub = JobSubmitted(job_id="bert-1", tenant="default", guaranteed=False, model=ModelRef("bert"),
                       global_batch_size=32, plan=Plan(dp=4, zero_stage=2), resources=Resources(4, 32),
                       target_iterations=target)
    agents.handle(ev("job.submitted", sub, 0.0))
    return agents


def drain(agents, until=math.inf):
    out = []
    while (t := agents.due()) is not None and t <= until:
        out.extend(agents.fire(t))
    return out


ZERO4 = Plan(dp=4, zero_stage=2)
ALLOC4 = (NodeShare("n0", 4, 32),)


def test_a_job_runs_at_the_measured_speed_and_completes(parts):
    agents = setup(parts)
    [started] = agents.handle(decide(10.0, "bert-1", ALLOC4, ZERO4))
    assert started.subject == "job.started" and started.payload.attempt == 1 and started.time == 10.0
    t_iter = parts.table.iter_time("bert", ZERO4, (4,))
    out = drain(agents)
    done = [e for e in out if e.subject == "job.completed"]
    assert len(done) == 1 and done[0].time == pytest.approx(10.0 + 1000 * t_iter)
    assert done[0].payload.iterations == 1000
    assert agents.truth.fallback_lookups == 0


def test_samples_come_one_iteration_after_start_then_periodically_and_the_modeler_accepts_them(parts):
    agents = setup(parts, target=20000, sample=300.0)
    agents.handle(decide(0.0, "bert-1", ALLOC4, ZERO4))
    t_iter = parts.table.iter_time("bert", ZERO4, (4,))
    samples = [e for e in drain(agents) if e.subject == "metrics.iteration"]
    assert samples[0].time == pytest.approx(t_iter) and samples[0].payload.iteration == 0
    assert [round(b.time - a.time, 6) for a, b in zip(samples, samples[1:])] == [300.0] * (len(samples) - 1)
    assert len(samples) == 1 + math.floor((20000 * t_iter - t_iter) / 300.0 - 1e-9)
    assert all(s.payload.iter_time_s == t_iter and s.payload.gpus_per_node == (4,) for s in samples)
    modeler = ModelerCore(parts.models, parts.env)
    answers = [a for s in samples for a in modeler.handle(s)]
    assert not [a for a in answers if a.subject == "metrics.rejected"]


def test_reconfiguration_costs_the_restart_and_keeps_progress(parts):
    agents = setup(parts, restart=100.0)
    agents.handle(decide(0.0, "bert-1", ALLOC4, ZERO4))
    t4 = parts.table.iter_time("bert", ZERO4, (4,))
    plan8, alloc8 = Plan(dp=8, zero_stage=2), (NodeShare("n1", 8, 64),)
    t8 = parts.table.iter_time("bert", plan8, (8,))
    t_change = 250.5 * t4  # 250 whole iterations done, half of one lost
    assert agents.handle(decide(t_change, "bert-1", alloc8, plan8, 2)) == []
    out = drain(agents)
    [reconf] = [e for e in out if e.subject == "job.reconfigured"]
    assert reconf.time == pytest.approx(t_change + 100.0) and reconf.payload.restart_cost_s == pytest.approx(100.0)
    [done] = [e for e in out if e.subject == "job.completed"]
    assert done.time == pytest.approx(t_change + 100.0 + 750 * t8)
    assert agents.restarts["reconfigure"] == 1


def test_preemption_keeps_whole_iterations_and_resuming_costs_a_restart(parts):
    agents = setup(parts, restart=50.0)
    agents.handle(decide(0.0, "bert-1", ALLOC4, ZERO4))
    t4 = parts.table.iter_time("bert", ZERO4, (4,))
    [pre] = agents.handle(decide(99.9 * t4, "bert-1", (), None, 2))
    assert pre.subject == "job.preempted" and pre.payload.iterations_done == 99
    assert agents.due() is None
    agents.handle(decide(5000.0, "bert-1", ALLOC4, ZERO4, 3))
    out = drain(agents)
    [start2] = [e for e in out if e.subject == "job.started"]
    assert start2.payload.attempt == 2 and start2.time == pytest.approx(5050.0)
    [done] = [e for e in out if e.subject == "job.completed"]
    assert done.time == pytest.approx(5050.0 + 901 * t4)


def test_start_cost_delays_the_first_start(parts):
    agents = setup(parts, start_cost_s=260.0)
    assert agents.handle(decide(0.0, "bert-1", ALLOC4, ZERO4)) == []
    out = drain(agents)
    assert [(e.subject, round(e.time, 6)) for e in out[:1]] == [("job.started", 260.0)]


def test_unmeasured_configurations_fall_back_to_the_model_and_are_counted(parts):
    agents = setup(parts)
    split = (NodeShare("n0", 3, 24), NodeShare("n1", 1, 8))
    assert parts.table.iter_time("bert", ZERO4, (3, 1)) is None
    [started] = agents.handle(decide(0.0, "bert-1", split, ZERO4))
    assert started.subject == "job.started"
    assert agents.truth.fallback_lookups == 1 and len(agents.truth.fallback_configs) == 1
    assert math.isfinite(agents.jobs["bert-1"].iter_s) and agents.jobs["bert-1"].iter_s > 0


def test_impossible_configurations_fail_the_job(parts):
    agents = setup(parts)
    [failed] = agents.handle(decide(0.0, "bert-1", (NodeShare("n0", 2, 16),), ZERO4))
    assert failed.subject == "job.failed" and "dp*tp*pp" in failed.payload.reason
    assert agents.due() is None and agents.unfinished() == []


def test_overcommitted_nodes_are_counted(parts):
    agents = setup(parts)
    agents.handle(decide(0.0, "bert-1", (NodeShare("n0", 4, 32),), ZERO4))
    sub = JobSubmitted(job_id="bert-2", tenant="default", guaranteed=False, model=ModelRef("bert"), global_batch_size=32,
                       plan=Plan(dp=8), resources=Resources(8, 64), target_iterations=10)
    agents.handle(ev("job.submitted", sub, 0.0))
    agents.handle(decide(1.0, "bert-2", (NodeShare("n0", 8, 64),), Plan(dp=8), 2))
    assert agents.capacity_violations == [(1.0, "n0", 12, 8)]


def test_a_lost_node_preempts_the_jobs_on_it(parts):
    agents = setup(parts)
    agents.handle(decide(0.0, "bert-1", ALLOC4, ZERO4))
    from controlplane.events import NodeLost
    [pre] = agents.handle(ev("node.lost", NodeLost("n0", "gone"), 10.0))
    assert pre.subject == "job.preempted" and "n0 lost" in pre.payload.reason and agents.holding == {}


def test_a_run_shorter_than_one_iteration_reports_that_iteration_before_it_completes(parts):
    agents = setup(parts, target=1)
    agents.handle(decide(5.0, "bert-1", ALLOC4, ZERO4))
    t_iter = parts.table.iter_time("bert", ZERO4, (4,))
    out = drain(agents)
    assert [e.subject for e in out] == ["metrics.iteration", "job.completed"]
    sample, done = out
    assert sample.time == done.time == pytest.approx(5.0 + t_iter)
    assert sample.payload.iteration == 0 and sample.payload.iter_time_s == t_iter


def test_the_capacity_check_kept_between_decisions_counts_what_a_fresh_count_does(parts):
    """The GPUs held per node are kept between decisions and only the jobs whose phase was set since are counted
    again: at every decision of a long random drive (starts, restarts, shrinks to zero, failures, completions, nodes
    lost and registered, nodes registered again with other GPUs under their jobs, decisions past a node's GPUs),
    what it records is what a count over every job holding an allocation gives."""
    import random

    from controlplane.events import NodeLost

    rng = random.Random(3)
    agents = SimulatedAgents(ground_truth(parts), restart_cost_s=5.0, sample_every_s=50.0)
    caps = {f"n{i}": 8 for i in range(4)}
    for node, gpus in caps.items():
        agents.handle(ev("node.registered", NodeRegistered(node, gpus, 80.0, 96, 1600.0), 0.0))
    ids = [f"bert-{i}" for i in range(12)]
    for job_id in ids:
        sub = JobSubmitted(job_id=job_id, tenant="default", guaranteed=False, model=ModelRef("bert"),
                           global_batch_size=32, plan=Plan(dp=2), resources=Resources(2, 16),
                           target_iterations=rng.choice((50, 400, 3000)))
        agents.handle(ev("job.submitted", sub, 0.0))
    seen, over_seen, held_most, t = 0, 0, 0, 0.0
    for step in range(400):
        t += rng.choice((0.5, 3.0, 20.0))
        drain(agents, t)
        if rng.random() < 0.03:
            node = rng.choice(sorted(caps))
            agents.handle(ev("node.lost", NodeLost(node, "gone"), t))
            agents.handle(ev("node.registered", NodeRegistered(node, rng.choice((4, 8)), 80.0, 96, 1600.0), t + 1e-3))
        elif rng.random() < 0.05:  # registered again with other GPUs, its jobs still on it
            node = rng.choice(sorted(caps))
            agents.handle(ev("node.registered", NodeRegistered(node, rng.choice((2, 8, 16)), 80.0, 96, 1600.0), t))
        decisions = []
        for job_id in rng.sample(ids, rng.randint(1, 3)):
            nodes = rng.sample(sorted(caps), rng.randint(1, 2))
            gpus = rng.choice((0, 1, 2, 4, 8))
            alloc = tuple(NodeShare(n, gpus, 8 * gpus) for n in nodes)
            plan = None if rng.random() < 0.01 else Plan(dp=max(1, gpus * len(nodes)), zero_stage=2)
            decisions.append(Decision(job_id, alloc, plan))
        agents.handle(ev("plan.decided", PlanDecided(step + 1, "test", tuple(decisions)), t))
        fresh: dict[str, int] = {}
        for job in agents.holding.values():
            for s in job.alloc:
                fresh[s.node] = fresh.get(s.node, 0) + s.gpus
        want = [(t, n, fresh[n], agents.nodes.get(n, 0)) for n in sorted(fresh) if fresh[n] > agents.nodes.get(n, 0)]
        assert agents.capacity_violations[seen:] == want, f"decision {step + 1}"
        seen = len(agents.capacity_violations)
        over_seen += bool(want)
        held_most = max(held_most, len(agents.holding))
    assert 20 < over_seen < 400  # the drive both overcommits nodes and leaves them within their GPUs
    assert agents.restarts["reconfigure"] > 0 and agents.failures and held_most >= 6
