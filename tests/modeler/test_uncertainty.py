"""Error bounds of the fitted model (modeler/uncertainty.py): out-of-fold error, bootstrap spread,
per plan family, and what they say about points the fit did and did not see."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.events import Plan
from modeler.configs import Config, ConfigBatch
from modeler.fit import Measurements, fit
from modeler.memory import resolve_ga
from modeler.perf_model import t_iter
from modeler.uncertainty import Uncertainty, estimate, families, interval, sigmas

from tests.modeler.test_fit import TRUE, configs


def _points(model, env, cfgs, noise=0.0, seed=1):
    batch = ConfigBatch.from_configs(cfgs)
    times = t_iter(model, env, TRUE, resolve_ga(model, env, batch))
    if noise:
        times = times * np.exp(np.random.default_rng(seed).normal(0.0, noise, len(times)))
    return Measurements(batch=batch, iter_time_s=times)


def _many(n_nodes=(1, 2, 4), gpus=(1, 2, 4, 8)):
    """DP, GC, ZeRO and offload configurations over several placements: enough points to leave some out."""
    out = []
    for nodes in n_nodes:
        for g in gpus:
            place = (g,) * nodes
            d = g * nodes
            for plan in (Plan(dp=d), Plan(dp=d, gc=True), Plan(dp=d, zero_stage=2),
                         Plan(dp=d, zero_stage=2, offload=True)):
                out.append(Config(plan=plan, gpus_per_node=place, cpus_per_gpu=4, global_batch_size=64))
    return out


def test_points_the_model_generates_give_a_tight_bound(models, env):
    model = models["bert"]
    pts = _points(model, env, configs(4))
    res = fit(model, env, pts)
    unc = estimate(model, env, pts, res)
    assert unc.folds == 10  # 11 points in 10 folds
    fam = dict(unc.by_family)
    # each point predicted by a fit without it: exact where the others inform the same terms (GC,
    # offload), not where the point is the only one crossing nodes (DP 4x4: k_sync then at its prior)
    assert fam["GC"] < 0.005 and fam["ZeRO-Offload"] < 0.005 and 0.005 < fam["DP"] < 0.1, fam
    assert unc.sigma_cv < 0.05 and unc.margin < 0.1
    assert len(unc.samples) == 16
    pred, low, high = interval(model, env, res.params, unc, resolve_ga(model, env, pts.batch))
    assert np.all(low < pred) and np.all(pred < high) and np.all(high / pred - 1 < 0.1)
    assert estimate(model, env, pts, res) == unc  # seeded: the same points give the same bound


def test_noise_in_the_points_shows_in_the_bound_and_the_bound_covers_new_points(models, env):
    model = models["bert"]
    cfgs = _many()
    pts = _points(model, env, cfgs, noise=0.05, seed=3)
    res = fit(model, env, pts)
    unc = estimate(model, env, pts, res)
    assert 0.025 < unc.sigma_cv < 0.12, unc.sigma_cv
    # new measurements of the same configurations, with fresh noise: about 90% inside their bound
    fresh = _points(model, env, cfgs, noise=0.05, seed=4)
    batch = resolve_ga(model, env, fresh.batch)
    _, low, high = interval(model, env, res.params, unc, batch)
    inside = np.mean((fresh.iter_time_s >= low) & (fresh.iter_time_s <= high))
    assert inside >= 0.75, inside


def test_a_family_only_one_point_informs_gets_a_wide_bound(models, env):
    """A pipeline point alone decides k_3d and k_pp: left out, nothing predicts it, and 3D predictions
    get a bound the DP points do not."""
    model = models["gpt2"]
    cfgs = configs(3) + [Config(plan=Plan(pp=4, tp=2), gpus_per_node=(2, 2, 2, 2), cpus_per_gpu=None,
                                global_batch_size=32)]
    batch = ConfigBatch.from_configs(cfgs)
    times = t_iter(model, env, TRUE, resolve_ga(model, env, batch))
    times[-1] *= 2.5  # the engine is much slower than the DP points suggest
    pts = Measurements(batch=batch, iter_time_s=times)
    res = fit(model, env, pts)
    unc = estimate(model, env, pts, res)
    fam = dict(unc.by_family)
    assert fam["3D"] > 0.3 and fam["DP"] < 0.05, fam
    probe = resolve_ga(model, env, ConfigBatch.from_configs([
        Config(plan=Plan(pp=2, tp=4), gpus_per_node=(4, 4), cpus_per_gpu=None, global_batch_size=32),
        Config(plan=Plan(dp=4), gpus_per_node=(4,), cpus_per_gpu=None, global_batch_size=32)]))
    s = sigmas(model, env, res.params, unc, probe)
    assert s[0] > 4 * s[1]
    assert list(families(probe)) == ["3D", "DP"]


def test_bounds_round_trip_and_bad_ones_are_refused(models, env):
    model = models["bert"]
    pts = _points(model, env, configs(4))
    unc = estimate(model, env, pts, fit(model, env, pts), n_samples=2)
    assert Uncertainty.from_dict(unc.as_dict()) == unc
    for bad, words in (({"folds": 3}, "sigma_cv"), ({"sigma_cv": float("nan"), "folds": 3}, "sigma_cv must be"),
                       ({"sigma_cv": 0.1, "folds": 3, "by_family": {"XX": 0.1}}, "plan families"),
                       ({"sigma_cv": 0.1, "folds": 3, "samples": [{"k_nope": 1}]}, "unknown parameter"), ([], "a map")):
        with pytest.raises(ValueError, match=words):
            Uncertainty.from_dict(bad)
