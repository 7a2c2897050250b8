from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

from controlplane.events import Plan
from modeler.configs import Config, ConfigBatch
from modeler.fit import FitError, Measurements, fit
from modeler.perf_model import PerfParams, t_iter

TRUE = PerfParams(k_bwd=1.9, k_sync=2.5, k_opt=0.08, k_opt_off=25.0, k_off=1.5, k_swap=3.0, k_const=0.02)


def configs(offload_points: int = 3):
    plain = [((1,), Plan()), ((2,), Plan(dp=2)), ((4,), Plan(dp=4)), ((8,), Plan(dp=8)),
             ((4, 4), Plan(dp=8)), ((8,), Plan(dp=8, zero_stage=2)), ((4,), Plan(dp=4, gc=True))]
    off = [((g,), Plan(dp=g, zero_stage=2, offload=True)) for g in (1, 2, 4, 8)][:offload_points]
    return [Config(plan=p, gpus_per_node=g, cpus_per_gpu=4, global_batch_size=32) for g, p in plain + off]


def measured(model, env, cfgs, params=TRUE):
    batch = ConfigBatch.from_configs(cfgs)
    return Measurements(batch=batch, iter_time_s=t_iter(model, env, params, batch))


def test_recovers_times_generated_by_the_model(models, env):
    model = models["bert"]
    pts = measured(model, env, configs())
    res = fit(model, env, pts)
    assert res.offload_fitted and res.rmsle < 1e-3
    # and predicts configurations it has not seen
    unseen = ConfigBatch.from_configs([Config(plan=Plan(dp=2, zero_stage=2, offload=True), gpus_per_node=(1, 1),
                                              cpus_per_gpu=8, global_batch_size=32),
                                       Config(plan=Plan(dp=8, gc=True), gpus_per_node=(2, 6), cpus_per_gpu=None,
                                              global_batch_size=32)])
    assert np.allclose(t_iter(model, env, res.params, unseen), t_iter(model, env, TRUE, unseen), rtol=0.02)


def test_bad_start_does_not_decide(models, env):
    model = models["bert"]
    pts = measured(model, env, configs())
    far = PerfParams(k_bwd=7.5, k_sync=45.0, k_opt=500.0, k_opt_off=5000.0, k_off=40.0, k_swap=40.0, k_const=50.0)
    assert fit(model, env, pts, initial=far).rmsle < 1e-3


def test_one_bad_measurement_does_not_drag_the_fit(models, env):
    model = models["bert"]
    cfgs = configs(4)
    pts = measured(model, env, cfgs)
    times = pts.iter_time_s.copy()
    times[2] *= 3.0  # one wild point
    res = fit(model, env, Measurements(batch=pts.batch, iter_time_s=times))
    err = np.abs(t_iter(model, env, res.params, pts.batch) / pts.iter_time_s - 1.0)
    assert np.median(np.delete(err, 2)) < 0.03


def test_too_few_points_is_a_clear_error(models, env):
    model = models["bert"]
    pts = measured(model, env, configs()[:5] + configs()[-1:])
    with pytest.raises(FitError, match=r"bert: 6 measured point\(s\) \(rows 1, 2, 3, 4, 5 and 6\).*at least 7"):
        fit(model, env, pts)
    labelled = replace(pts, labels=(3, 5, 8, 13, 21, 34))  # the rows of the file they came from
    with pytest.raises(FitError, match=r"bert: 6 measured point\(s\) \(rows 3, 5, 8, 13, 21 and 34\)"):
        fit(model, env, labelled)


def test_missing_offload_points_is_a_clear_error(models, env):
    model = models["bert"]
    pts = measured(model, env, configs(2))
    with pytest.raises(FitError, match=r"2 ZeRO-Offload point\(s\) \(rows 8 and 9\), 2 measurements.*at least 3"):
        fit(model, env, pts)
    no_offload = measured(model, env, configs(0))
    assert not fit(model, env, no_offload).offload_fitted
    with pytest.raises(FitError, match="0 ZeRO-Offload point"):
        fit(model, env, no_offload, need_offload=True)


def test_breakdown_parts_count_as_measurements(models, env):
    model = models["bert"]
    pts = measured(model, env, configs()[:4] + configs()[-3:-1])
    with pytest.raises(FitError):
        fit(model, env, pts)
    n = len(pts.batch)
    fwd = np.full(n, 0.05)
    with_parts = Measurements(batch=pts.batch, iter_time_s=pts.iter_time_s, fwd_s=fwd,
                              opt_s=np.full(n, 0.02))
    with pytest.raises(FitError, match="ZeRO-Offload"):  # 6 points + 12 parts, but offload: 2 rows + 4 parts
        fit(model, env, Measurements(batch=pts.batch.take(slice(0, 5)), iter_time_s=pts.iter_time_s[:5],
                                     fwd_s=fwd[:5]))
    assert fit(model, env, with_parts).n_points == n


def test_nan_and_non_positive_times_refused(models, env):
    batch = ConfigBatch.from_configs(configs())
    times = np.ones(len(batch))
    times[3] = np.nan
    with pytest.raises(FitError, match="row 4: the iteration time must be a finite time > 0 s, got nan"):
        Measurements(batch=batch, iter_time_s=times)
    times[3], times[6] = 0.0, -1.0
    with pytest.raises(FitError, match=r"rows 4 and 7: .* got 0.0, -1.0"):
        Measurements(batch=batch, iter_time_s=times)
    times[3] = times[6] = 1.0
    fwd = np.full(len(batch), np.nan)
    fwd[2] = -0.1
    with pytest.raises(FitError, match="row 3: breakdown part fwd_s must be >= 0 s"):
        Measurements(batch=batch, iter_time_s=times, fwd_s=fwd)
    fwd[2] = 2.0
    with pytest.raises(FitError, match="row 3: breakdown part fwd_s is longer than the whole iteration"):
        Measurements(batch=batch, iter_time_s=times, fwd_s=fwd, labels=tuple(range(1, len(batch) + 1)))


def test_duplicate_configurations_must_agree():
    from modeler.fit import check_duplicates

    check_duplicates(["a", "b", "a"], [1.0, 2.0, 1.05], [1, 2, 3])  # a repeat within 10%: two measurements
    with pytest.raises(FitError, match=r"rows 1 and 3 are the same configuration with conflicting times \(1, 1.2 s"):
        check_duplicates(["a", "b", "a"], [1.0, 2.0, 1.2], [1, 2, 3])


def test_a_point_of_weight_zero_is_left_out(models, env):
    model = models["bert"]
    cfgs = configs(4)
    pts = measured(model, env, cfgs)
    times = pts.iter_time_s.copy()
    times[1] *= 2.0
    skewed = Measurements(batch=pts.batch, iter_time_s=times)
    w = np.ones(len(cfgs))
    w[1] = 0.0
    keep = np.arange(len(cfgs)) != 1
    without = fit(model, env, Measurements(batch=pts.batch.take(keep), iter_time_s=times[keep]))
    weighted = fit(model, env, skewed, weights=w)
    assert weighted.n_points == len(cfgs) - 1
    a, b = weighted.params.as_dict(), without.params.as_dict()
    assert all(abs(a[k] - b[k]) <= 1e-3 * abs(b[k]) for k in a), (a, b)
    with pytest.raises(ValueError, match="weights"):
        fit(model, env, skewed, weights=-w)


def test_fit_is_deterministic(models, env):
    model = models["gpt2"]
    pts = measured(model, env, configs())
    assert fit(model, env, pts) == fit(model, env, pts)


def test_what_the_points_do_not_inform_stays_at_its_prior(models, env):
    # every point inside one node: nothing tells how the inter-node sync overlaps the backward, and
    # no point uses TP or PP
    from modeler.fit import PRIORS

    model = models["bert"]
    cfgs = [c for c in configs(4) if len(c.gpus_per_node) == 1]
    res = fit(model, env, measured(model, env, cfgs))
    assert not {"k_3d", "k_tp", "k_pp"} & set(res.fitted)
    assert (res.params.k_3d, res.params.k_tp, res.params.k_pp) == (1.0, 1.0, 0.0)
    assert res.rmsle < 0.01


def test_engine_parameters_are_recovered(models, env):
    model = models["t5"]
    true = replace(TRUE, k_3d=2.5, k_tp=4.0, k_pp=0.04)
    plans = [((1,), Plan()), ((2,), Plan(dp=2)), ((4,), Plan(dp=4)), ((8,), Plan(dp=8)), ((4, 4), Plan(dp=8)),
             ((4,), Plan(tp=4)), ((2, 2, 2, 2), Plan(tp=2, pp=4)), ((1, 1, 1, 1), Plan(pp=4)),
             ((8,) * 4, Plan(tp=8, pp=4))]
    cfgs = [Config(plan=p, gpus_per_node=g, cpus_per_gpu=4, global_batch_size=32) for g, p in plans]
    res = fit(model, env, measured(model, env, cfgs, true))
    assert {"k_3d", "k_tp", "k_pp"} <= set(res.fitted) and res.rmsle < 2e-3
    assert np.isclose(res.params.k_pp, 0.04, rtol=0.1) and np.isclose(res.params.k_tp, 4.0, rtol=0.2)
    unseen = ConfigBatch.from_configs([Config(plan=p, gpus_per_node=g, cpus_per_gpu=4, global_batch_size=32)
                                       for g, p in [((8, 8), Plan(tp=8, pp=2)), ((4,) * 8, Plan(tp=4, pp=8)),
                                                    ((2, 2), Plan(tp=2, pp=2))]])
    assert np.allclose(t_iter(model, env, res.params, unseen), t_iter(model, env, true, unseen), rtol=0.02)


def test_the_solver_is_imported_by_a_fit_or_by_load_solver_not_by_the_import():
    """Importing the modeler must not pay the solver's import (an offline run that never refits skips
    it); `load_solver` pays it up front for a long-running service. Fresh interpreters: this one has
    scipy already."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    check = ("import sys; import modeler.fit, modeler.service, policy.service; "
             "before = 'scipy.optimize' in sys.modules; modeler.fit.load_solver(); "
             "print(before, 'scipy.optimize' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", check], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr
