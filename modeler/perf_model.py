"""The iteration-time model of the paper's appendix A, vectorised over a batch of configurations.

    T_iter = T_cc + T_oo + k_const

- T_fwd: the profiled forward of one GPU at the spec's global batch, scaled linearly to the
  per-GPU batch (DP) and tensor shard (TP); under PP with m micro-batches and p stages the fill
  gives T_fwd = t_p * g_p / p * (m + p - 1), i.e. the full-model time per micro-batch and stage
  times (m + p - 1). GA runs `a` forward/backward passes of 1/a of the batch each. Plans with
  t * p > 1 run on the tensor/pipeline engine, whose compute is scaled by k_3d.
- T_bwd = k_bwd * T_fwd, plus one extra forward under gradient checkpointing (GC), except under
  ZeRO-Offload (docs/modeler.md, extension 11).
- Communication T = V / B with the bottleneck bandwidth of the placement: NVLink when the group
  stays inside one node, the inter-node link when it crosses nodes (the NICs a group reaches,
  shared by the t tensor-parallel ranks of a node; `Environment.b_inter_rails`).
  V_dp = P * 2(d-1) / (d t p),  V_tp = 8 (t-1) b s h l / (d t),  V_pp = 2 p b s h / (d t)
  (each 0 when its degree is 1), in elements of 2 bytes (16-bit gradients and activations).
  T_tp is scaled by k_tp, and each of the m + p - 1 steps of the tensor/pipeline engine's schedule
  adds k_pp seconds (t * p > 1; with p = 1 that is one step per micro-batch).
- DP synchronisation: plain DP all-reduces the gradients during the backward (T_sync = T_dp).
  ZeRO stages 1-2 reduce them during the backward (half the volume, as one reduce per destination
  rank, d / (d - 1) times a ring reduce-scatter's traffic; not under ZeRO-Offload) and all-gather the
  updated 16-bit parameters after the optimizer step (the other half, T_ag, on the critical path);
  stage 3 also all-gathers the parameters for the forward and again for the backward. Under
  ZeRO-Offload the synchronisation overlaps the offload traffic inside T_oo (as the appendix has it)
  and is not counted again in T_cc.
- T_cc = a T_fwd' + (a-1) T_bwd' + f_overlap^k_sync(T_bwd', T_sync) + T_tp + T_pp, where ' is one
  GA step.
- T_opt = k_opt * P / x with x = t p (3D) or d t p (ZeRO); under ZeRO-Offload the step runs on
  the CPUs: T_opt = k_opt_off * P / (d t p c) with c CPU threads per GPU.
- T_off = P / (d t p B_pcie) in 4 bytes per parameter: 2 down (16-bit gradients, T_off_down) and
  2 up (16-bit parameters, T_off_up), T_off = T_off_down + T_off_up.
- T_oo = f_overlap^k_off(T_dp, T_off_down) + f_overlap^k_swap(T_opt, T_off_up) + T_host under
  ZeRO-Offload: the gradients go down beside the gradient synchronisation and the parameters come
  up beside the CPU step, each direction counted once. T_host = P * `Environment.offload_ns_per_param`
  is the host's per-step work that does not shrink with more GPUs. Otherwise T_oo = T_opt + T_ag.
- f_overlap^k(x, y) = (x^k + y^k)^(1/k): x + y at k = 1, towards max(x, y) as k grows.

Units of the fitted parameters: k_bwd, k_sync, k_off, k_swap, k_3d, k_tp are pure numbers; k_opt
is nanoseconds per parameter on one GPU; k_opt_off is nanoseconds per parameter on one CPU
thread; k_const and k_pp are seconds. Pure code: no I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

from .configs import ConfigBatch
from .env import Environment
from .spec import ModelType

PARAM_NAMES = ("k_bwd", "k_sync", "k_opt", "k_opt_off", "k_off", "k_swap", "k_const", "k_3d", "k_tp", "k_pp")
APPENDIX_PARAMS = PARAM_NAMES[:7]
"""The seven parameters of the appendix; `k_3d`, `k_tp` and `k_pp` are this implementation's
extensions for the tensor/pipeline engine (docs/modeler.md, "Extensions")."""
OFFLOAD_PARAMS = ("k_opt_off", "k_off", "k_swap")
ENGINE_PARAMS = ("k_3d",)
"""Fitted only when a point runs on the tensor/pipeline-parallel engine (tp * pp > 1)."""
TP_PARAMS = ("k_tp",)
"""Fitted only when a point uses tensor parallelism (tp > 1)."""
PP_PARAMS = ("k_pp",)
"""Fitted only when a point uses pipeline parallelism (pp > 1)."""
OPTIONAL_PARAMS = {"k_3d": 1.0, "k_tp": 1.0, "k_pp": 0.0}
"""Parameters a parameter file may leave out (files written before they existed): their neutral value."""
GRAD_BYTES = 2.0
"""Bytes per element of gradients and activations on the wire (16-bit mixed precision)."""
OFFLOAD_BYTES = 4.0
"""Bytes moved over PCIe per parameter under ZeRO-Offload (16-bit gradients down, parameters up)."""
OFFLOAD_BYTES_DOWN = 2.0
"""Of which gradients to the host (overlapped with the gradient synchronisation, k_off)."""
NS = 1e-9


@dataclass(frozen=True)
class PerfParams:
    """The fittable parameters (units in the module docstring); the last three are neutral by default."""

    k_bwd: float = 2.0
    k_sync: float = 2.0
    k_opt: float = 0.1
    k_opt_off: float = 20.0
    k_off: float = 2.0
    k_swap: float = 2.0
    k_const: float = 0.01
    k_3d: float = 1.0
    k_tp: float = 1.0
    k_pp: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}

    @staticmethod
    def from_dict(data: dict[str, float]) -> "PerfParams":
        names = {f.name for f in fields(PerfParams)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown parameter(s) {', '.join(unknown)}; expected {', '.join(PARAM_NAMES)}")
        data = {**OPTIONAL_PARAMS, **data}
        missing = sorted(names - set(data))
        if missing:
            raise ValueError(f"missing parameter(s) {', '.join(missing)}")
        values = {}
        for k in PARAM_NAMES:
            v = data[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
                raise ValueError(f"parameter {k} must be a finite number >= 0, got {v!r}")
            values[k] = float(v)
        return PerfParams(**values)


def f_overlap(x: np.ndarray, y: np.ndarray, k: float) -> np.ndarray:
    """(x^k + y^k)^(1/k), computed without overflow for large k; 0 where both are 0."""
    m = np.maximum(x, y)
    safe = np.where(m > 0, m, 1.0)
    return np.where(m > 0, safe * ((x / safe) ** k + (y / safe) ** k) ** (1.0 / k), 0.0)


@dataclass(frozen=True)
class Parts:
    """The model's parts for each configuration, in seconds."""

    t_fwd: np.ndarray     # forward of the whole iteration (all GA steps, PP fill)
    t_bwd: np.ndarray     # backward of the whole iteration (with GC's extra forward)
    t_comm_dp: np.ndarray  # the whole DP volume V_dp over its bandwidth
    t_comm_tp: np.ndarray
    t_comm_pp: np.ndarray
    t_cc: np.ndarray
    t_opt: np.ndarray
    t_off: np.ndarray     # the whole PCIe traffic under ZeRO-Offload, both directions
    t_oo: np.ndarray
    t_iter: np.ndarray
    t_sync: np.ndarray    # DP synchronisation overlapped with the last backward (in T_cc)
    t_ag: np.ndarray      # ZeRO's parameter all-gather after the optimizer step (in T_oo)


@dataclass(frozen=True)
class Fixed:
    """What `parts` computes from a batch of configurations alone, before any parameter enters: a fit, which
    evaluates the same batch under many parameter sets, computes it once (`fixed_parts`)."""

    a: np.ndarray          # GA steps
    a_less: np.ndarray     # a - 1
    fwd: np.ndarray        # the forward before k_3d
    engine: np.ndarray     # t * p > 1: the tensor/pipeline engine
    gc_fwd: np.ndarray     # GC recomputes the forward in the backward (not under ZeRO-Offload)
    steps: np.ndarray      # m + p - 1
    t_comm_dp: np.ndarray
    tp: np.ndarray         # T_tp before k_tp
    pp: np.ndarray         # T_pp's transfers
    t_sync: np.ndarray
    t_ag: np.ndarray
    t_ag_fwd: np.ndarray
    off: np.ndarray
    shards: np.ndarray
    off_cpus: np.ndarray   # d t p c
    t_off: np.ndarray
    t_off_down: np.ndarray
    t_off_up: np.ndarray
    t_host: float


def fixed_parts(model: ModelType, env: Environment, batch: ConfigBatch) -> Fixed:
    """The parts of `parts` that no parameter changes, for `batch`."""
    spec = model.spec
    d = batch.dp.astype(np.float64)
    t = batch.tp.astype(np.float64)
    p = batch.pp.astype(np.float64)
    a = np.maximum(batch.ga_steps, 1).astype(np.float64)  # 0 (left to the modeler) is resolved by callers
    m = batch.micro_batches.astype(np.float64)
    b = batch.global_batch
    P = float(spec.num_params)
    shs = float(spec.seq_len * spec.hidden_size)
    zero = batch.zero_stage > 0
    off = batch.offload

    # forward: per-GPU batch and tensor shard, PP fill over m micro-batches and p stages
    fwd = model.fwd_time_s * (b / spec.global_batch_size) / (d * t) * (m + p - 1.0) / (m * p)

    # communication volumes (bytes) over the bottleneck bandwidth of the placement
    v_dp = GRAD_BYTES * P * 2.0 * (d - 1.0) / (d * t * p)
    v_tp = GRAD_BYTES * 8.0 * (t - 1.0) * b * shs * spec.num_layers / (d * t)
    v_pp = np.where(p > 1, GRAD_BYTES * 2.0 * p * b * shs / (d * t), 0.0)
    # the t tensor-parallel ranks of a node run their DP all-reduces and PP sends at the same time,
    # over the same NICs
    b_inter = env.b_inter_rails(batch.min_node_gpus) / t
    t_comm_dp = v_dp / np.where(batch.dp_inter, b_inter, env.b_intra)

    # DP synchronisation: all-reduce in the backward (plain DP); ZeRO's reduce-scatter in the
    # backward and parameter all-gather after the step; under offload all of it inside T_oo
    half = 0.5 * t_comm_dp
    # DeepSpeed's stage 1-2 reduce runs as one reduce per destination rank, each of which carries its
    # whole slice over every link of the chain: d / (d - 1) times a ring reduce-scatter's traffic
    reduce = half * d / np.maximum(d - 1.0, 1.0)
    stage3 = batch.zero_stage == 3

    # optimizer and offload
    cpus = np.where(np.isnan(batch.cpus), float(env.default_cpus_per_gpu), batch.cpus)
    b_pcie = env.b_pcie if model.b_pcie_gbps is None else model.b_pcie_gbps * 1e9
    t_off = np.where(off, OFFLOAD_BYTES * P / (d * t * p * b_pcie), 0.0)
    # each direction of the PCIe traffic overlaps its own neighbour: gradients down beside the
    # gradient synchronisation, updated parameters up beside the CPU step (tiled in DeepSpeed's CPU Adam)
    t_off_down = t_off * (OFFLOAD_BYTES_DOWN / OFFLOAD_BYTES)
    return Fixed(
        a=a, a_less=a - 1.0, fwd=fwd, engine=t * p > 1, gc_fwd=batch.gc & ~batch.offload, steps=m + p - 1.0,
        t_comm_dp=t_comm_dp, tp=v_tp / np.where(batch.tp_inter, b_inter, env.b_intra),
        pp=v_pp / np.where(batch.pp_inter, b_inter, env.b_intra),
        t_sync=np.where(off, 0.0, np.where(zero, np.where(stage3, t_comm_dp, reduce), t_comm_dp)),
        t_ag=np.where(zero & ~off & ~stage3, half, 0.0), t_ag_fwd=np.where(stage3, half, 0.0),
        off=off, shards=np.where(zero, d * t * p, t * p), off_cpus=d * t * p * cpus,
        t_off=t_off, t_off_down=t_off_down, t_off_up=t_off - t_off_down,
        t_host=env.offload_ns_per_param * NS * P)


def parts(model: ModelType, env: Environment, params: PerfParams, batch: ConfigBatch,
          fixed: Fixed | None = None) -> Parts:
    """Every part for every configuration. The parameters may also be numpy arrays of shape (k, 1),
    giving (k, n) arrays: k parameter sets at once (the fit's finite differences). `fixed`: `fixed_parts` of
    the same model, environment and batch, computed once for many calls."""
    f = fixed_parts(model, env, batch) if fixed is None else fixed
    a, off = f.a, f.off

    # the tensor/pipeline engine's compute is scaled by k_3d
    t_fwd = np.where(f.engine, params.k_3d, 1.0) * f.fwd
    t_fwd_step = t_fwd / a
    t_bwd_step = params.k_bwd * t_fwd_step + np.where(f.gc_fwd, t_fwd_step, 0.0)

    t_comm_tp = params.k_tp * f.tp
    # a fixed time per step of the engine's schedule, m + p - 1 steps (one per micro-batch at p = 1)
    t_comm_pp = f.pp + np.where(f.engine, params.k_pp * f.steps, 0.0)
    t_sync = f.t_sync
    t_cc = (a * t_fwd_step + f.a_less * t_bwd_step + f_overlap(t_bwd_step, t_sync, params.k_sync)
            + t_comm_tp + t_comm_pp + f.t_ag_fwd)

    t_opt = np.where(off, params.k_opt_off * NS * float(model.spec.num_params) / f.off_cpus, params.k_opt * NS * float(model.spec.num_params) / f.shards)
    t_oo = np.where(off, f_overlap(f.t_comm_dp, f.t_off_down, params.k_off) + f_overlap(t_opt, f.t_off_up, params.k_swap)
                    + f.t_host, t_opt + f.t_ag)

    total = t_cc + t_oo + params.k_const
    return Parts(t_fwd=t_fwd, t_bwd=t_bwd_step * a, t_comm_dp=f.t_comm_dp, t_comm_tp=t_comm_tp,
                 t_comm_pp=t_comm_pp, t_cc=t_cc, t_opt=t_opt, t_off=f.t_off, t_oo=t_oo, t_iter=total,
                 t_sync=t_sync, t_ag=f.t_ag)


def t_iter(model: ModelType, env: Environment, params: PerfParams, batch: ConfigBatch) -> np.ndarray:
    """Predicted seconds per iteration for every configuration of the batch."""
    return parts(model, env, params, batch).t_iter
