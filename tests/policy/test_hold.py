"""Damping and batching: a job just changed is held against best-effort reasons, a burst of
best-effort submissions on a full cluster costs one round, and a guarantee gets what it needs."""

from __future__ import annotations

from controlplane.events import ClockTick, Plan

from .helpers import Clock, completed, decisions, job, node, table_core
from .test_guarantees import check_round, core_for

BERT = Plan(dp=1)


def gpus(core, job_id: str) -> int:
    return sum(g for g, _, _ in core.last[job_id].shares.values()) if job_id in core.last else 0


def tick(c: Clock, seq: int, dt: float, period: float = 60.0):
    return c.ev("clock.tick", ClockTick(seq=seq, period_s=period), dt=dt)


def grown_then_arrival(hold_s):
    """One 8-GPU node; `a` runs alone and grows to the whole node, then `b` arrives a second later."""
    core = table_core("rubick", ["bert"], hold_s=hold_s, batch_s=0)
    c = Clock()
    core.handle(c.ev("node.registered", node("n0")))
    core.handle(tick(c, 0, 0.0))  # ticks run: a held job's round comes again
    core.handle(c.ev("job.submitted", job("a", "bert", 32, BERT, 1, iters=10**6)))
    assert gpus(core, "a") > 1
    out = core.handle(c.ev("job.submitted", job("b", "bert", 32, BERT, 1, iters=10**6)))
    return core, c, out


def test_without_a_hold_an_arrival_shrinks_a_job_placed_a_second_ago():
    core, _, out = grown_then_arrival(0)
    assert gpus(core, "b") >= 1 and decisions(out)["a"].reason == "shrunk"


def test_a_job_changed_a_moment_ago_is_held_until_the_hold_ends_then_the_tick_retries():
    core, c, out = grown_then_arrival(156.0)
    assert "a" not in decisions(out) and gpus(core, "b") == 0  # a keeps the node
    assert core.dirty  # the hold kept b waiting: the next tick must try again
    out = core.handle(tick(c, 1, 60.0))
    assert "a" not in decisions(out) and gpus(core, "b") == 0  # 62 s after a's change: still held
    out = core.handle(tick(c, 2, 100.0))
    assert gpus(core, "b") >= 1 and decisions(out)["a"].reason == "shrunk"
    check_round(core)


def test_a_guarantee_under_its_minimum_takes_gpus_from_a_held_job():
    core = core_for("rubick", hold_s=10**6, batch_s=0)
    c = Clock()
    core.handle(c.ev("node.registered", node("n0")))
    core.handle(c.ev("job.submitted", job("be", "bert", 32, BERT, 1, iters=10**6)))
    assert gpus(core, "be") == 8
    out = core.handle(c.ev("job.submitted", job("g", "bert", 32, Plan(dp=4), 4, 32, guaranteed=True)))
    d = decisions(out)
    assert d["g"].reason == "guarantee" and sum(s.gpus for s in d["g"].allocation) >= 4
    assert d["be"].reason == "shrunk"
    check_round(core)


def full_cluster(batch_s):
    core = table_core("rubick", ["bert"], hold_s=0, batch_s=batch_s)
    c = Clock()
    core.handle(c.ev("node.registered", node("n0")))
    core.handle(tick(c, 0, 0.0))
    core.handle(c.ev("job.submitted", job("a", "bert", 32, BERT, 1, iters=10**6)))
    assert gpus(core, "a") == 8
    return core, c


def test_a_burst_of_best_effort_submissions_on_a_full_cluster_waits_for_one_round():
    core, c = full_cluster(60.0)
    rounds = core.round
    for i in range(3):
        out = core.handle(c.ev("job.submitted", job(f"b{i}", "bert", 32, BERT, 1, iters=10**6)))
        assert [e.subject for e in out] == ["plan.pending"]  # no round: it says it waits for the batch
        assert [(p.job_id, p.reason) for p in out[0].payload.pending] == [(f"b{i}", "batch")]
        assert core.state.jobs[f"b{i}"].pending.reason == "batch"
    assert core.round == rounds and core.dirty
    out = core.handle(tick(c, 1, 57.0))
    assert core.round == rounds + 1  # the three, in one round
    assert set(decisions(out)) >= {"b0", "b1", "b2"}
    assert sum(gpus(core, j) for j in ("a", "b0", "b1", "b2")) == 8
    check_round(core)


def test_batching_never_delays_a_guarantee_a_free_gpu_or_a_cluster_without_ticks():
    core, c = full_cluster(60.0)
    out = core.handle(c.ev("job.submitted", job("g", "bert", 32, Plan(dp=2), 2, 16, guaranteed=True)))
    assert decisions(out)["g"].reason == "guarantee"
    core = table_core("rubick", ["bert"], hold_s=0, batch_s=60.0)
    c = Clock()
    core.handle(c.ev("node.registered", node("n0")))
    core.handle(c.ev("job.submitted", job("a", "bert", 32, BERT, 1, iters=10**6)))
    out = core.handle(c.ev("job.submitted", job("b", "bert", 32, BERT, 1, iters=10**6)))
    assert gpus(core, "b") >= 1  # no tick seen: nothing would run a deferred round, so none is deferred
    core, c = full_cluster(60.0)
    core.handle(c.ev("job.completed", completed("a")))
    out = core.handle(c.ev("job.submitted", job("b", "bert", 32, BERT, 1, iters=10**6)))
    assert gpus(core, "b") >= 1  # GPUs free: it starts at once


def test_a_guarantee_whose_minimum_is_over_its_curves_knee_gets_its_minimum():
    core = core_for("rubick", batch_s=0)
    core.oracle.overshoot.update(llama30=10.0)  # no other plan trusted: the request's 48 GPUs or nothing
    c = Clock()
    for i in range(6):
        core.handle(c.ev("node.registered", node(f"n{i}")))
    spec = job("big", "llama30", 4, Plan(dp=4, tp=4, pp=3), 48, 384, guaranteed=True)
    d = decisions(core.handle(c.ev("job.submitted", spec)))["big"]
    assert d.reason == "guarantee" and sorted(s.gpus for s in d.allocation) == [8] * 6
    assert d.plan == Plan(dp=4, tp=4, pp=3) and d.detail["normalised"] == "1"
    check_round(core)


def churn(backoff_s: float, cycles: int = 6) -> list[float]:
    """One 8-GPU node: a long job `a`, and a short job arriving and ending again and again beside it,
    with a tick every minute. The times at which decisions changed `a`."""
    core = table_core("rubick", ["bert"], hold_s=156.0, batch_s=0, hold_backoff_s=backoff_s)
    c = Clock()
    core.handle(c.ev("node.registered", node("n0")))
    core.handle(tick(c, 0, 0.0))
    core.handle(c.ev("job.submitted", job("a", "bert", 32, BERT, 1, iters=10**7)))
    changed, seq = [], 0
    for k in range(cycles):
        for event in [c.ev("job.submitted", job(f"b{k}", "bert", 32, BERT, 1, iters=10**6), dt=30.0)]:
            out = core.handle(event)
            changed += [c.t] if "a" in decisions(out) else []
        for _ in range(20):  # twenty minutes of ticks with b running, then b ends and ticks go on
            seq += 1
            out = core.handle(tick(c, seq, 60.0))
            changed += [c.t] if "a" in decisions(out) else []
        out = core.handle(c.ev("job.completed", completed(f"b{k}")))
        changed += [c.t] if "a" in decisions(out) else []
        check_round(core)
    return changed


def test_a_job_changed_again_and_again_is_held_longer_each_time():
    """Short jobs coming and going beside a long one: with a fixed hold the long job is shrunk and grown
    back every cycle (a restart each time); with the backoff, each change within the window doubles
    its hold, so it is changed less, and never before its hold of the moment is over."""
    fixed, backoff = churn(0.0), churn(3600.0)
    assert len(fixed) >= 10  # shrunk when b arrives (after the hold), grown back when b ends
    assert len(backoff) < len(fixed)
    for i in range(1, len(backoff)):  # n changes within the hour before: held 2^(n-1) x 156 s
        n = sum(1 for t in backoff[:i] if backoff[i] - t < 3600.0)
        assert backoff[i] - backoff[i - 1] >= min(16, 2 ** (n - 1)) * 156.0, (i, n, backoff)
    assert max(b - a for a, b in zip(backoff, backoff[1:])) > 4 * 156.0  # it did back off
