"""What the policy core hands the engine for a job (`PolicyCore.job_in`): every field of `JobIn`, read back by
name. `job_in` builds it positionally (it runs once per job a round), so a field put in the wrong place, or a
field added to `JobIn` without `job_in` following, must fail here: each field gets a value no other field has."""

from __future__ import annotations

import dataclasses

from controlplane.events import (ClockTick, JobStarted, MetricsIteration, ModelRef, NodeShare, Plan, Resources,
                                 JobSubmitted)
from policy.engine import JobIn

from .helpers import UNREAD, Clock, node
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


def test_a_round_hands_the_engine_what_job_in_builds_at_its_time():
    """A job nothing happened to takes its last round's input again, with the fields that follow the clock, its
    progress and its status brought forward (`PolicyCore._inputs`). Round by round, through what changes a job
    (its priority, a suspension and a resumption, a cancellation, a preemption, measured iterations, one run as
    asked, a late report of a guarantee waiting, a node lost, a refit, a new tick period, holds forgotten, a node lost
    under a job a guarantee just took its GPUs from), every input the engine is handed equals, field by field, what
    `job_in` builds then; but the fields that follow the clock of a best-effort job holding nothing, which the engine
    says it does not read (`RubickEngine.waiting_clock`): the same input object is handed over with them as they
    were. So are those of a running job the engine keeps dormant while its hold surely lasts (`PolicyCore._resting`):
    the engine may not read them (they are made unreadable here) before it asks for them, and then they are what
    `job_in` builds."""
    from controlplane.events import JobCompleted, JobPreempted, ModelUpdated, NodeLost
    from controlplane.events.payloads import JobControl, JobPriority
    from modeler.service import make_core

    from .helpers import job

    core = core_for("rubick", hold_s=None, hold_backoff_s=40.0)  # changes older than 40 s are forgotten
    c = Clock()
    seen = {"rounds": 0, "inputs": 0, "again": 0, "changed_before": 0, "asleep": 0, "delta": 0, "resting": 0,
            "brought": 0}
    clock = {"remaining_iters", "elapsed_s", "changed_s", "recent_changes", "ref_iter_s"}
    assert core.engine.waiting_clock is False
    last: dict[str, object] = {}
    schedule = core.engine.schedule_changed  # what the service asks of an engine that has it

    handed: dict[str, object] = {}
    wake = core._wake_resting

    def as_built(inp, skip=()) -> None:
        fresh = core.job_in(core.state.jobs[inp.job_id], c.t)
        for f in dataclasses.fields(JobIn):
            if f.name not in skip:
                assert getattr(inp, f.name) == getattr(fresh, f.name), (inp.job_id, f.name)

    def woken(ids):  # the engine asks for the inputs of resting jobs it reads: brought forward to the round's time
        wake(ids)
        for job_id in ids:
            seen["brought"] += 1
            as_built(handed[job_id])

    core._wake_resting = woken

    def checked(nodes, jobs, touched=None):
        t = c.t
        if touched is not None:  # the promise the engine looks at only these on: the others are as handed last
            seen["delta"] += 1
            for job_id, inp in jobs.items():
                assert job_id in touched or handed.get(job_id) is inp, job_id
            assert handed.keys() - jobs.keys() <= set(touched)  # a job handed then and not now is named
        handed.clear()
        handed.update(jobs)
        for inp in jobs.values():
            fresh = core.job_in(core.state.jobs[inp.job_id], t)
            asleep = not fresh.running and not fresh.guaranteed
            seen["asleep"] += asleep and last.get(inp.job_id) is inp
            # a dormant job's input resting (`PolicyCore._resting`): held, as the engine is promised; the fields that
            # follow the clock as an earlier round left them, and no one may read them before the engine asks
            resting = inp.job_id in core._resting
            if resting:
                seen["resting"] += 1
                assert fresh.running and fresh.current and fresh.changed_s < core.engine.rest_hold(fresh.recent_changes)
            as_built(inp, clock if asleep or resting else ())
            seen["again"] += last.get(inp.job_id) is inp
            seen["changed_before"] += not resting and inp.recent_changes > 0 and not inp.current
            last[inp.job_id] = inp
            if resting:
                for name in clock:
                    setattr(inp, name, UNREAD)
        seen["rounds"] += 1
        seen["inputs"] += len(jobs)
        return schedule(nodes, jobs, touched)

    core.engine.schedule_changed = checked
    core.handle(c.ev("clock.tick", ClockTick(seq=0, period_s=60.0)))
    for i in range(2):
        core.handle(c.ev("node.registered", node(f"n{i}")))
    kinds = [("gpt2", Plan(dp=8)), ("bert", Plan(dp=4)), ("vit", Plan(dp=4))]
    for i in range(14):  # more than two nodes hold: most wait
        model, plan = kinds[i % 3]
        core.handle(c.ev("job.submitted", job(f"j{i:02d}", model, 32, plan, plan.dp, guaranteed=i % 4 == 0,
                                              iters=10**6)))

    def waiting() -> list[str]:
        return sorted(j.job_id for j in core.state.jobs.values()
                      if j.status in ("queued", "preempted") and not j.decided_allocation)

    def running() -> list[str]:
        return sorted(j.job_id for j in core.state.jobs.values() if j.status == "running")

    def tick(n: int, period: float = 60.0) -> None:
        core.handle(c.ev("clock.tick", ClockTick(seq=n, period_s=period), dt=30.0))

    def start_decided() -> None:  # the agents: start what was placed, stop what was preempted
        for j in list(core.state.jobs.values()):
            if j.decided_allocation and j.status != "running":
                core.handle(c.ev("job.started", JobStarted(job_id=j.job_id, allocation=j.decided_allocation,
                                                           plan=j.decided_plan)))
            elif j.status == "running" and not j.decided_allocation:
                core.handle(c.ev("job.preempted", JobPreempted(job_id=j.job_id, reason="preempted",
                                                               iterations_done=j.iterations_done)))

    start_decided()
    tick(1)
    a, b, d = waiting()[:3]
    core.handle(c.ev("job.priority", JobPriority(job_id=a, priority=7)))
    tick(2)
    core.handle(c.ev("job.suspend", JobControl(job_id=b)))
    tick(3)
    core.handle(c.ev("job.resume", JobControl(job_id=b)))
    tick(4, period=30.0)
    core.handle(c.ev("job.cancel", JobControl(job_id=d)))
    tick(5)
    victim = running()[0]
    share = core.state.jobs[victim].allocation[0]
    core.handle(c.ev("metrics.iteration", MetricsIteration(
        job_id=victim, model_type=core.state.jobs[victim].model_type, iteration=99, iter_time_s=0.5,
        plan=core.state.jobs[victim].plan, gpus_per_node=(share.gpus,), cpus_per_gpu=max(1, share.cpus // share.gpus))))
    core.handle(c.ev("job.preempted", JobPreempted(job_id=victim, reason="node drained", iterations_done=100)))
    tick(6)
    start_decided()
    keeps = running()[-1]  # measured: its remaining iterations follow the clock while it runs
    share = core.state.jobs[keeps].allocation[0]
    core.handle(c.ev("metrics.iteration", MetricsIteration(
        job_id=keeps, model_type=core.state.jobs[keeps].model_type, iteration=9, iter_time_s=0.5,
        plan=core.state.jobs[keeps].plan, gpus_per_node=(share.gpus,), cpus_per_gpu=max(1, share.cpus // share.gpus))))
    late = next(j for j in waiting() if core.state.jobs[j].guaranteed)  # a guarantee waiting since the first round
    st = core.state.jobs[late]  # a late report of it: its progress and measured speed move while it waits
    assert late not in core.progress and late not in core.ref_iter
    core.handle(c.ev("metrics.iteration", MetricsIteration(
        job_id=late, model_type=st.model_type, iteration=499, iter_time_s=0.7, plan=st.requested_plan,
        gpus_per_node=(st.requested.gpus,), cpus_per_gpu=4)))
    assert core.progress[late].iterations == 500 and late in core.ref_iter
    params = dict(make_core().types["bert"].params.as_dict())
    params["k_bwd"] *= 1.3
    core.handle(c.ev("model.updated", ModelUpdated(model_type="bert", version=2, params=params, n_points=9,
                                                   rmsle=0.05)))
    tick(7)
    core.handle(c.ev("node.lost", NodeLost(node="n1", reason="test")))
    tick(8)
    sure = next(j for j in running() if core.state.jobs[j].guaranteed and j != running()[0])
    st = core.state.jobs[sure]  # a guarantee measured as asked: the speed its deadline is counted at
    core.handle(c.ev("metrics.iteration", MetricsIteration(
        job_id=sure, model_type=st.model_type, iteration=4, iter_time_s=0.4, plan=st.requested_plan,
        gpus_per_node=(st.requested.gpus,), cpus_per_gpu=4)))
    assert core.ref_iter[sure] == 0.4
    for j in running()[:1]:
        core.handle(c.ev("job.completed", JobCompleted(job_id=j, iterations=10**6)))
    start_decided()
    for n in range(9, 15):  # and the clock runs on: recent changes are forgotten
        tick(n)
        start_decided()
    # a guarantee takes a node's GPUs from jobs still running there (no agent has stopped them yet), then the node
    # is lost: those jobs are no longer running, though no event names them
    core.handle(c.ev("job.submitted", job("gx", "bert", 32, Plan(dp=4), 4, guaranteed=True, iters=10**6)))
    stopping = [j.job_id for j in core.state.jobs.values() if j.status == "running" and not j.decided_allocation]
    assert stopping, "the guarantee must preempt a running job for this test to mean anything"
    lost = core.state.jobs[stopping[0]].allocation[0].node
    core.handle(c.ev("job.priority", JobPriority(job_id=waiting()[0], priority=1)))  # a round in between
    core.handle(c.ev("node.lost", NodeLost(node=lost, reason="test")))
    core.handle(c.ev("node.registered", node("n2")))  # a round with a node to run on
    assert core.state.jobs[stopping[0]].status == "preempted"
    assert seen["rounds"] >= 10 and seen["again"] >= 30  # waiting jobs' inputs were taken again, and checked
    assert seen["changed_before"] > 0  # a waiting job that a decision changed before: its recent changes count
    assert seen["asleep"] >= 10  # waiting best-effort jobs handed over as they were
    assert seen["delta"] >= 10  # with the jobs whose inputs changed named
    assert seen["resting"] > 0  # a dormant job's input rested, unread
    assert core.state.jobs[a].priority == 7 and core.state.jobs[b].status != "suspended"
    assert core.state.jobs[victim].iterations_done == 100


def test_a_job_folded_into_the_state_past_the_core_is_handed_to_the_engine():
    """The core keeps the round's inputs between rounds and makes again those of the jobs its events touched. A job
    put in the state directly (as bench/policy_round.py does, to time rounds alone) is seen all the same: the
    state's count of folded events differs from the core's, and the list is made again whole."""
    from .helpers import job

    core = core_for("rubick", hold_s=None)
    c = Clock()
    core.handle(c.ev("clock.tick", ClockTick(seq=0, period_s=60.0)))
    core.handle(c.ev("node.registered", node("n0")))
    core.handle(c.ev("job.submitted", job("a", "gpt2", 64, Plan(dp=1), 1)))
    assert core.last["a"].shares  # it takes the node (and is held there: b waits)
    core.state.apply(c.ev("job.submitted", job("b", "gpt2", 64, Plan(dp=1), 1)))  # past the core
    answers = core.run_round(c.ev("clock.tick", ClockTick(seq=1, period_s=60.0)))
    assert "b" in core.last and not core.last["b"].shares  # the engine was asked about it
    assert any(p.job_id == "b" for e in answers if e.base == "plan.pending" for p in e.payload.pending)


def test_events_folded_without_their_rounds_give_the_round_a_whole_look_would():
    """`PolicyCore.fold` is `handle` without the round an event would run: a driver hands over a completion, a
    submission and the agents' answers, then asks for one round (bench/policy_round.py). That round looks only at the
    inputs those events touched, and must decide what a round that looks at every input again decides: a second core
    given the same events, which hands its engine every open job's input as `_inputs` makes them (as for an engine
    that reads the clock fields of waiting jobs) and has it look at every one, round after round."""
    import random

    from controlplane.events import JobCompleted, JobPreempted, JobReconfigured, encode

    from .helpers import job

    rng = random.Random(3)
    cores = [core_for("rubick", hold_s=None), core_for("rubick", hold_s=None)]
    c = Clock()
    handed = []  # the touched ids each incremental round of the first core was given
    incremental, whole = cores[0].engine.schedule_changed, cores[1].engine.schedule_changed

    def spy(nodes, jobs, touched=None):
        handed.append(touched)
        return incremental(nodes, jobs, touched)

    cores[0].engine.schedule_changed = spy
    cores[1].engine.schedule_changed = lambda nodes, jobs, touched=None: whole(nodes, jobs, None)
    cores[1].engine.waiting_clock = True
    first = [c.ev("clock.tick", ClockTick(seq=0, period_s=60.0))]
    first += [c.ev("node.registered", node(f"n{i}", gpus=4, cpus=48)) for i in range(3)]
    for core in cores:
        for ev in first:
            core.fold(ev)
    n = 0

    def submission():
        nonlocal n
        n += 1
        model, gbs = rng.choice([("gpt2", 64), ("bert", 64)])
        return c.ev("job.submitted", job(f"j{n}", model, gbs, Plan(dp=rng.choice([1, 2])), rng.choice([1, 2, 4]),
                                         guaranteed=n % 3 == 0, tenant=f"t{n % 2}"), dt=0.0)

    def feed(events):
        for ev in events:
            for core in cores:
                assert not [e for e in core.fold(ev) if e.base == "plan.decided"]  # no round of its own

    feed([submission() for _ in range(8)])
    assert cores[0].dirty
    published = [[], []]
    decided_any = 0
    for r in range(1, 25):
        tick = c.ev("clock.tick", ClockTick(seq=r, period_s=60.0), dt=30.0)
        outs = [core.run_round(tick) for core in cores]
        for out, mine in zip(outs, published):
            mine += [encode(e) for e in out if e.base == "plan.decided"]
        decided = [e for e in outs[0] if e.base == "plan.decided"]
        decided_any += bool(decided)
        answers = []
        for ev in decided:  # what the node agents answer
            for d in ev.payload.decisions:
                js = cores[0].state.jobs[d.job_id]
                if d.allocation and js.status != "running":
                    answers.append(c.ev("job.started", JobStarted(job_id=d.job_id, allocation=d.allocation,
                                                                  plan=d.plan), dt=0.0))
                elif d.allocation:
                    answers.append(c.ev("job.reconfigured", JobReconfigured(
                        job_id=d.job_id, allocation=d.allocation, plan=d.plan, restart_cost_s=78.0), dt=0.0))
                elif js.status == "running":
                    answers.append(c.ev("job.preempted", JobPreempted(job_id=d.job_id, reason="test",
                                                                      iterations_done=0), dt=0.0))
        feed(answers)
        running = sorted(j.job_id for j in cores[0].state.jobs_in("running"))
        if running and r % 2:
            feed([c.ev("job.completed", JobCompleted(job_id=rng.choice(running), iterations=1000), dt=1.0)])
        feed([submission()])
    assert published[0] == published[1]
    assert decided_any >= 5  # the rounds decided things, not only kept them
    later = handed[1:]
    assert later and all(t is not None for t in later)  # the first core's rounds were incremental
    assert sum(len(t) for t in later) < sum(len(cores[0].state.jobs) for _ in later)  # looking at fewer inputs
