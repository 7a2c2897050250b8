from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.events import Plan
from modeler.configs import Config, ConfigBatch
from modeler.perf_model import PerfParams, f_overlap, fixed_parts, parts, t_iter


def batch(*configs):
    return ConfigBatch.from_configs(list(configs), allow_tp_across_nodes=True)


def cfg(gpn=(8,), **plan):
    return Config(plan=Plan(**plan), gpus_per_node=gpn, cpus_per_gpu=None, global_batch_size=16)


@settings(max_examples=100, deadline=None)
@given(st.floats(0, 1e3), st.floats(0, 1e3), st.floats(1, 200))
def test_f_overlap_lies_between_max_and_sum(x, y, k):
    v = float(f_overlap(np.array([x]), np.array([y]), k)[0])
    assert max(x, y) * (1 - 1e-9) <= v <= (x + y) * (1 + 1e-9) + 1e-300


def test_f_overlap_limits():
    x, y = np.array([3.0]), np.array([4.0])
    assert f_overlap(x, y, 1.0)[0] == 7.0
    assert abs(f_overlap(x, y, 2.0)[0] - 5.0) < 1e-12
    assert abs(f_overlap(x, y, 500.0)[0] - 4.0) < 1e-2


def test_pipeline_fill_and_ga(models, env):
    m = models["gpt2"]
    p = PerfParams()
    one = parts(m, env, p, batch(cfg(gpn=(1,))))
    # PP over p stages with m micro-batches: t_fwd = t1 / p * (m + p - 1) / m
    pp4 = parts(m, env, p, batch(cfg(gpn=(1, 1, 1, 1), pp=4, micro_batches=4)))
    assert np.isclose(pp4.t_fwd[0], one.t_fwd[0] / 4 * (4 + 4 - 1) / 4)
    # GA keeps the forward work, adds (a-1) un-overlapped backward passes
    ga4 = parts(m, env, p, batch(cfg(gpn=(2,), dp=2, ga_steps=4)))
    dp2 = parts(m, env, p, batch(cfg(gpn=(2,), dp=2)))
    assert np.isclose(ga4.t_fwd[0], dp2.t_fwd[0])
    assert ga4.t_iter[0] > dp2.t_iter[0]


def test_gc_adds_one_forward(models, env):
    m, p = models["bert"], PerfParams(k_sync=50.0)
    a = parts(m, env, p, batch(cfg(gpn=(1,))))
    b = parts(m, env, p, batch(cfg(gpn=(1,), gc=True)))
    assert np.isclose(b.t_iter[0] - a.t_iter[0], a.t_fwd[0])


def test_gc_under_zero_offload_recomputes_nothing(models, env):
    """The runs the paper names ZeRO-Offload+GC show no recompute (docs/modeler.md, extension 11)."""
    m, p = models["gpt2"], PerfParams()
    plain, gc = (parts(m, env, p, batch(Config(plan=Plan(dp=4, zero_stage=2, offload=True, gc=g), gpus_per_node=(4,),
                                                 cpus_per_gpu=4, global_batch_size=16)))
                 for g in (False, True))
    assert gc.t_iter[0] == plain.t_iter[0] and gc.t_bwd[0] == plain.t_bwd[0]
    zero = [parts(m, env, p, batch(cfg(gpn=(4,), dp=4, zero_stage=2, gc=g))) for g in (False, True)]
    assert zero[1].t_iter[0] > zero[0].t_iter[0]  # ZeRO-2 without offload still recomputes


def test_bottleneck_bandwidth_of_the_placement(models, env):
    m, p = models["roberta"], PerfParams()
    inside = parts(m, env, p, batch(cfg(gpn=(8,), dp=8)))
    across = parts(m, env, p, batch(cfg(gpn=(4, 4), dp=8)))
    b_across = float(env.b_inter_rails(4))
    assert np.isclose(across.t_comm_dp[0] / inside.t_comm_dp[0], env.b_intra / b_across)
    assert inside.t_comm_tp[0] == 0 and inside.t_comm_pp[0] == 0


def test_inter_node_rails_follow_the_smallest_node(models, env):
    # 4 NICs per node, a GPU pair behind each: a node with 1 or 2 GPUs reaches one NIC, 3 or 4 two
    assert env.nics_per_node == 4 and env.gpus_per_node == 8
    per_nic = env.b_inter / 4
    assert np.allclose(env.b_inter_rails(np.array([1, 2, 3, 4, 7, 8])), per_nic * np.array([1, 1, 2, 2, 4, 4]))
    m, p = models["roberta"], PerfParams()
    one, two = parts(m, env, p, batch(cfg(gpn=(1, 7), dp=8), cfg(gpn=(4, 4), dp=8))).t_comm_dp
    assert np.isclose(one / two, 2.0)


def test_tp_ranks_share_the_nics(models, env):
    m, p = models["llama7"], PerfParams()
    dp_only = Config(plan=Plan(dp=16), gpus_per_node=(8, 8), cpus_per_gpu=None, global_batch_size=16)
    with_tp = Config(plan=Plan(dp=4, tp=4), gpus_per_node=(8, 8), cpus_per_gpu=None, global_batch_size=16)
    a, b = parts(m, env, p, batch(dp_only, with_tp)).t_comm_dp
    # per-rank volume 1/4 under TP=4, but the 4 TP ranks of a node share its NICs: same time per byte
    v_a, v_b = 2 * 2.0 * m.spec.num_params * 15 / 16, 2 * 2.0 * m.spec.num_params * 3 / 16
    assert np.isclose(b / a, (v_b * 4) / v_a)


def test_offload_uses_cpus_and_pcie(models, env):
    m, p = models["t5"], PerfParams()
    few = Config(plan=Plan(zero_stage=2, offload=True), gpus_per_node=(1,), cpus_per_gpu=2, global_batch_size=16)
    many = Config(plan=Plan(zero_stage=2, offload=True), gpus_per_node=(1,), cpus_per_gpu=8, global_batch_size=16)
    a, b = parts(m, env, p, batch(few, many)).t_opt
    assert np.isclose(a / b, 4.0)
    pr = parts(m, env, p, batch(few))
    assert np.isclose(pr.t_off[0], 4.0 * m.spec.num_params / (m.b_pcie_gbps * 1e9))
    plain = parts(replace(m, b_pcie_gbps=None), env, p, batch(few))
    assert np.isclose(plain.t_off[0], 4.0 * m.spec.num_params / (env.b_pcie_gbps * 1e9))
    assert pr.t_oo[0] >= max(pr.t_opt[0], pr.t_off[0] / 2)


def test_zero_dp_shards_the_optimizer(models, env):
    m, p = models["gpt2"], PerfParams()
    dp = parts(m, env, p, batch(cfg(gpn=(4,), dp=4)))
    zero = parts(m, env, p, batch(cfg(gpn=(4,), dp=4, zero_stage=2)))
    assert np.isclose(dp.t_opt[0] / zero.t_opt[0], 4.0)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]))
def test_more_data_parallel_gpus_never_slower_inside_a_node(d):
    from modeler.spec import load_model
    from tests.modeler.conftest import ENV_FILE, MODELS
    from modeler.env import load_env

    m, env = load_model(MODELS / "bert.yaml"), load_env(ENV_FILE)
    p = PerfParams(k_bwd=2.0, k_sync=3.0)
    t1 = t_iter(m, env, p, batch(cfg(gpn=(d,), dp=d)))[0]
    t2 = t_iter(m, env, p, batch(cfg(gpn=(2 * d,), dp=2 * d)))[0] if 2 * d <= 8 else t1
    assert t2 <= t1


def test_vectorised_equals_one_by_one(models, env):
    m, p = models["llama7"], PerfParams()
    cfgs = [cfg(gpn=(8,), tp=8), cfg(gpn=(4, 4), dp=2, tp=4), cfg(gpn=(8, 8), dp=2, tp=4, pp=2),
            cfg(gpn=(8,), dp=8, zero_stage=2, offload=True)]
    whole = t_iter(m, env, p, batch(*cfgs))
    single = [t_iter(m, env, p, batch(c))[0] for c in cfgs]
    assert np.allclose(whole, single)


def test_zero_splits_the_dp_volume(models, env):
    # plain DP all-reduces in the backward; ZeRO 1-2 reduce there (half the volume, as d reduces of
    # 1/d each: d / (d - 1) times a ring reduce-scatter) and all-gather the updated parameters after
    # the step (the other half); stage 3 also gathers them for the forward and the backward
    m, p = models["gpt2"], PerfParams(k_sync=1.0)
    pr = parts(m, env, p, batch(*[cfg(gpn=(4, 4), dp=8, zero_stage=z) for z in (0, 1, 2, 3)]))
    whole = pr.t_comm_dp[0]
    assert whole > 0 and np.allclose(pr.t_comm_dp, whole)
    reduce = whole / 2 * 8 / 7
    assert np.allclose(pr.t_sync, [whole, reduce, reduce, whole])
    assert np.allclose(pr.t_ag, [0.0, whole / 2, whole / 2, 0.0])
    assert np.allclose(pr.t_oo, pr.t_opt + pr.t_ag)
    assert pr.t_iter[3] > pr.t_iter[2]


def test_offload_counts_the_sync_once_in_t_oo(models, env):
    m, p = models["t5"], PerfParams(k_off=1.7, k_swap=2.3)
    pr = parts(m, env, p, batch(cfg(gpn=(4, 4), dp=8, zero_stage=2, offload=True)))
    assert pr.t_sync[0] == 0 and pr.t_ag[0] == 0
    host = env.offload_ns_per_param * 1e-9 * m.spec.num_params
    assert host > 0
    # each direction of the PCIe traffic (half of t_off) overlaps its own neighbour, once
    expect = (f_overlap(pr.t_comm_dp, pr.t_off / 2, 1.7) + f_overlap(pr.t_opt, pr.t_off / 2, 2.3) + host)[0]
    assert np.isclose(pr.t_oo[0], expect)


def test_offload_host_time_is_the_same_on_any_gpus(models, env):
    m, p = models["bert"], PerfParams()
    placements = [((1,), 1), ((2,), 2), ((8,), 8), ((4, 4), 8), ((1,) * 8, 8)]
    cfgs = [cfg(gpn=g, dp=d, zero_stage=2, offload=True) for g, d in placements]
    with_host = t_iter(m, env, p, batch(*cfgs))
    without = t_iter(m, replace(env, offload_ns_per_param=0.0), p, batch(*cfgs))
    assert np.allclose(with_host - without, env.offload_ns_per_param * 1e-9 * m.spec.num_params)
    plain = [cfg(gpn=(8,), dp=8), cfg(gpn=(8,), dp=8, zero_stage=2)]
    assert np.allclose(t_iter(m, env, p, batch(*plain)), t_iter(m, replace(env, offload_ns_per_param=0.0), p,
                                                              batch(*plain)))


def test_engine_parameters_scale_tp_and_add_per_pipeline_step(models, env):
    m = models["t5"]
    cfgs = [cfg(gpn=(8,), tp=8), cfg(gpn=(4, 4), tp=4, pp=2), cfg(gpn=(2, 2, 2, 2), tp=2, pp=4, micro_batches=2),
            cfg(gpn=(8,), dp=8)]
    base = parts(m, env, PerfParams(), batch(*cfgs))
    tuned = parts(m, env, PerfParams(k_tp=3.0, k_pp=0.05), batch(*cfgs))
    assert np.allclose(tuned.t_comm_tp, 3.0 * base.t_comm_tp)
    # m + p - 1 steps of the engine's schedule, one at p = 1 under TP; none off the engine (plain DP)
    steps = np.array([1.0, 1 + 2 - 1, 2 + 4 - 1, 0.0])
    assert np.allclose(tuned.t_comm_pp - base.t_comm_pp, 0.05 * steps)


def test_parameter_files_without_the_engine_parameters_load_neutral(models, env):
    seven = {"k_bwd": 2.0, "k_sync": 1.2, "k_opt": 0.09, "k_opt_off": 6.0, "k_off": 1.5, "k_swap": 1.5,
             "k_const": 0.06}
    old = PerfParams.from_dict(seven)
    assert (old.k_3d, old.k_tp, old.k_pp) == (1.0, 1.0, 0.0)
    assert PerfParams.from_dict({**seven, "k_3d": 1.3}).k_3d == 1.3
    m = models["llama7"]
    b = batch(cfg(gpn=(8, 8), dp=2, tp=4, pp=2))
    assert np.allclose(t_iter(m, env, old, b), t_iter(m, env, PerfParams(**seven, k_3d=1.0, k_tp=1.0, k_pp=0.0), b))


def test_environment_files_without_the_offload_host_time_load(tmp_path):
    from modeler.env import load_env
    from tests.modeler.conftest import ENV_FILE

    text = "\n".join(line for line in ENV_FILE.read_text().splitlines() if not line.startswith("offload_ns_per_param"))
    (tmp_path / "env.yaml").write_text(text + "\n")
    assert load_env(tmp_path / "env.yaml").offload_ns_per_param == 0.0
    assert load_env(ENV_FILE).offload_ns_per_param > 0


def test_what_no_parameter_changes_is_computed_once_for_many_parameter_sets(models, env):
    """A fit evaluates one batch under many parameter sets with `fixed_parts` computed once: each set, and k sets at
    once as (k, 1) arrays, gives the same parts, bit for bit, as computing everything again for that set."""
    m = models["gpt2"]
    b = batch(cfg(gpn=(8,), dp=8), cfg(gpn=(4, 4), dp=2, tp=2, pp=2, micro_batches=4, ga_steps=2),
              cfg(gpn=(2, 2), dp=4, zero_stage=3, gc=True), cfg(gpn=(4,), dp=4, zero_stage=2, gc=True),
              Config(plan=Plan(dp=4, zero_stage=2, offload=True), gpus_per_node=(4,), cpus_per_gpu=6,
                     global_batch_size=16))
    unmoved = fixed_parts(m, env, b)
    sets = [PerfParams(), replace(PerfParams(), k_bwd=2.5, k_3d=1.3, k_tp=0.7, k_pp=0.002, k_sync=3.0, k_off=2.0,
                                  k_swap=4.0, k_opt_off=5.0, k_const=0.05)]
    names = [f.name for f in fields(PerfParams)]
    many = PerfParams(**{k: np.array([[getattr(p, k)] for p in sets]) for k in names})
    together = parts(m, env, many, b, unmoved)
    for i, p in enumerate(sets):
        alone, reused = parts(m, env, p, b), parts(m, env, p, b, unmoved)
        for f in fields(alone):
            assert np.array_equal(getattr(alone, f.name), getattr(reused, f.name)), f.name
            assert np.array_equal(np.broadcast_to(getattr(together, f.name), (len(sets), len(b)))[i],
                                  getattr(alone, f.name)), f.name
    assert not np.array_equal(parts(m, env, sets[0], b).t_iter, parts(m, env, sets[1], b).t_iter)
