"""How far the policy trusts predictions for a guarantee: measured overshoot and packed placements."""

from __future__ import annotations

import math

from controlplane.events import MetricsIteration, Plan

from .helpers import Clock, decisions, job, node
from .test_guarantees import check_round, core_for

GPT2_8 = Plan(dp=8, zero_stage=2)


def predicted(oracle, models, name, gbs, place, plan, cpg=1):
    times, plans = oracle.evaluate(models[name], gbs, place, cpg, [plan])
    return float(times[0]), plans[0]


def test_overshoot_is_the_largest_first_measurement_over_its_prediction_per_type():
    core = core_for("rubick")
    oracle, models = core.oracle, core.models
    t, plan = predicted(oracle, models, "gpt2", 16, (4,), Plan(dp=4, zero_stage=2))
    assert not oracle.observe(models["gpt2"], 16, (4,), 8, plan, t * 0.7)  # faster than predicted: no doubt
    assert oracle.overshoot.get("gpt2", 0.0) == 0.0
    t8, plan8 = predicted(oracle, models, "gpt2", 16, (8,), GPT2_8)
    assert oracle.observe(models["gpt2"], 16, (8,), 8, plan8, t8 * 1.4)
    assert math.isclose(oracle.overshoot["gpt2"], 0.4)
    assert not oracle.observe(models["gpt2"], 16, (8,), 8, plan8, t8 * 3.0)  # only a configuration's first
    t2, plan2 = predicted(oracle, models, "gpt2", 16, (2,), Plan(dp=2, zero_stage=2))
    assert not oracle.observe(models["gpt2"], 16, (2,), 8, plan2, t2 * 1.2)  # smaller miss: kept at the largest
    assert math.isclose(oracle.overshoot["gpt2"], 0.4) and "vit" not in oracle.overshoot
    for bad in (0.0, -1.0, math.nan, math.inf):
        assert not oracle.observe(models["vit"], 64, (1,), 8, Plan(dp=1), bad)
    off = Plan(dp=1, zero_stage=2, offload=True)
    assert not oracle.observe(models["t5"], 16, (1,), None, off, 100.0)  # offload without its CPU count
    assert "vit" not in oracle.overshoot and "t5" not in oracle.overshoot


def run_guaranteed_gpt2(core, c, job_id):
    out = core.handle(c.ev("job.submitted", job(job_id, "gpt2", 16, GPT2_8, 8, 64, guaranteed=True)))
    check_round(core)
    return decisions(out)[job_id]


def test_a_measured_overshoot_keeps_a_guaranteed_job_on_its_own_request():
    core = core_for("rubick")
    core.oracle.bounds.clear()  # the fixed margin, not the fit's bound: only the measured overshoot at play
    c = Clock()
    for n in ("n0", "n1"):
        core.handle(c.ev("node.registered", node(n)))
    first = run_guaranteed_gpt2(core, c, "g1")
    used = sum(s.gpus for s in first.allocation)
    assert used > 8 and first.plan != GPT2_8  # trusted: it takes idle GPUs with the predicted best plan
    gain = float(first.detail["normalised"]) - 1.0
    t, plan = predicted(core.oracle, core.models, "gpt2", 16, tuple(s.gpus for s in first.allocation), first.plan)
    # the measured iteration of that choice runs slower than predicted by more than the predicted gain
    slow = MetricsIteration(job_id="g1", model_type="gpt2", iteration=0, iter_time_s=t * (1.05 + gain), plan=plan,
                            gpus_per_node=tuple(s.gpus for s in first.allocation), cpus_per_gpu=8)
    core.handle(c.ev("metrics.iteration", slow))
    assert core.oracle.overshoot["gpt2"] > gain
    second = run_guaranteed_gpt2(core, c, "g2")
    assert [s.gpus for s in second.allocation] == [8] and second.plan == GPT2_8
    assert second.reason == "guarantee" and second.detail["normalised"] == "1"


def test_a_guaranteed_job_is_packed_on_the_node_it_can_have_whole_not_split_over_free_gpus():
    core = core_for("rubick")
    core.oracle.overshoot.update(vit=10.0, gpt2=10.0)  # no alternative plan is trusted: requests exactly
    c = Clock()
    for n in ("n0", "n1"):
        core.handle(c.ev("node.registered", node(n)))
    core.handle(c.ev("job.submitted", job("a", "vit", 64, Plan(dp=4), 4, 32, guaranteed=True)))
    core.handle(c.ev("job.submitted", job("b", "gpt2", 16, Plan(dp=4, zero_stage=2), 4, 32)))
    assert core.last["a"].reason == "guarantee" and sum(g for g, _, _ in core.last["b"].shares.values()) == 8
    free_node = next(n for n in ("n0", "n1") if n not in core.last["b"].shares)
    assert core.last["a"].shares[free_node][0] == 4  # 4 GPUs free beside a, the other node all b's
    run_guaranteed_gpt2(core, c, "c")
    got = core.last["c"]
    assert got.reason == "guarantee" and "quota" not in got.detail
    assert [g for g, _, _ in got.shares.values()] == [8] and got.plan == GPT2_8
    assert next(iter(got.shares)) != free_node  # it took b's node whole rather than 4 + 4 over two nodes


def test_the_fits_error_bound_is_the_guarantee_margin_in_place_of_the_fixed_one():
    """The bound of the plan family from the type's fit (`model.updated`'s error_bounds, or the seeded
    ones) decides how much a predicted gain a guaranteed job needs: below its gain it moves, above it
    it stays. A family without a bound of its own takes the type's."""
    from controlplane.events import ModelUpdated
    from modeler.uncertainty import plan_family

    probe = core_for("rubick")
    probe.oracle.bounds.clear()
    c = Clock()
    for n in ("n0", "n1"):
        probe.handle(c.ev("node.registered", node(n)))
    moved = run_guaranteed_gpt2(probe, c, "g0")
    gain = float(moved.detail["normalised"]) - 1.0
    assert gain > 0.1  # the fixed 10% margin lets it move
    family = plan_family(moved.plan)

    def with_bounds(bounds):
        core = core_for("rubick")
        assert core.oracle.bounds["gpt2"]["all"] > 0  # seeded from the fit on fit_points.csv
        c = Clock()
        for n in ("n0", "n1"):
            core.handle(c.ev("node.registered", node(n)))
        upd = ModelUpdated(model_type="gpt2", version=1, params=core.oracle.params["gpt2"].as_dict(), n_points=7,
                           rmsle=0.01, error_bounds=bounds)
        core.handle(c.ev("model.updated", upd))
        assert core.oracle.bounds["gpt2"] == bounds
        return run_guaranteed_gpt2(core, c, "g1")

    def stayed(d):
        return [s.gpus for s in d.allocation] == [8] and d.plan == GPT2_8 and d.reason == "guarantee"

    assert stayed(with_bounds({"all": 0.01, family: gain * 1.2}))  # its plan's family may be off by more
    assert not stayed(with_bounds({"all": gain * 1.2, family: gain * 0.5}))
    assert stayed(with_bounds({"all": gain * 1.2}))  # no bound of its family: the type's
    assert not stayed(with_bounds({"all": gain * 0.5}))
