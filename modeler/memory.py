"""GPU and host memory of an execution plan, and whether it fits.

Per GPU the estimate adds:

- model states for the parameters of one TP x PP shard. Without ZeRO (Megatron 3D, plain DP):
  16 bytes per parameter on every GPU (16-bit parameters and gradients, 32-bit master weights
  and two Adam moments). Under ZeRO, DeepSpeed's own estimators
  (`estimate_zero2_model_states_mem_needs`, `estimate_zero3_model_states_mem_needs`). For stage
  1-2 without offload the estimate is that of DeepSpeed 0.9.2, the testbed's version: 4 bytes
  per parameter (16-bit parameters and full 16-bit gradients) plus 16 / d; later releases print
  2 + 18 / d, which is never larger, so the testbed's figure is the one that holds on it.
  ZeRO-Offload keeps only the 16-bit parameters on the GPU (2 bytes) and the rest on the host;
- activations of the micro-batches in flight (Korthikanti et al. 2022: s b h (34 + 5 a s / h) bytes
  per layer, divided by TP; under GC only each layer's 2 s b h input plus one layer in full), for
  the layers of one pipeline stage and up to min(m, p) micro-batches (1F1B), plus the output
  logits;
- a fixed overhead (CUDA context, NCCL, allocator) and DeepSpeed's two 16-bit communication
  buckets under ZeRO.

A plan fits when that total is at most `USABLE_FRACTION` of the GPU's memory (the allocator
fragments the rest) and, under ZeRO-Offload, DeepSpeed's host estimate fits in the host memory.

The vectorised functions repeat DeepSpeed's formulas so that thousands of plans cost one numpy
pass; `deepspeed_model_states` calls DeepSpeed itself (imported lazily, since it is slow to
import) and the tests check the two agree. Pure code: no I/O.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

import numpy as np

from .configs import ConfigBatch, divisors
from .env import Environment
from .spec import ModelType

GB = 1e9
OVERHEAD_BYTES = 3.0 * GB
"""CUDA context, NCCL buffers and allocator reserve on every GPU."""
ZERO_BUCKET_BYTES = 2 * 5e8 * 2
"""DeepSpeed's reduce and all-gather buckets (5e8 elements each, 16-bit) under ZeRO."""
USABLE_FRACTION = 0.9
"""Share of a GPU's memory the allocator can hand out before fragmentation stops it."""
HOST_BUFFER_FACTOR = 1.5
"""DeepSpeed's `additional_buffer_factor` for host memory."""


def largest_layer_params(model: ModelType) -> float:
    """Parameters of the largest single layer: a transformer block or the embedding."""
    h = model.spec.hidden_size
    return float(max(12 * h * h, model.vocab_size * h))


def model_states_bytes(model: ModelType, batch: ConfigBatch) -> tuple[np.ndarray, np.ndarray]:
    """(GPU bytes per GPU, host bytes for the job) of parameters, gradients and optimizer states."""
    shard = float(model.spec.num_params) / (batch.tp * batch.pp)
    d = batch.dp.astype(np.float64)
    z = batch.zero_stage
    off = batch.offload
    largest = 4.0 * largest_layer_params(model) / batch.tp
    per_node = np.minimum(batch.gpus, np.ceil(batch.gpus / batch.nodes))
    # stage 0 (Megatron 3D, plain DP): mixed-precision Adam, everything on every GPU
    gpu0 = 16 * shard
    # stages 1-2: DeepSpeed's stage-2 estimator (0.9.2 without offload, see the module docstring)
    gpu2 = np.where(off, 2 * shard, 4 * shard + np.floor(16 * shard / d))
    cpu2 = np.where(off, shard * np.maximum(4 * d, 16) * HOST_BUFFER_FACTOR,
                    shard * 4 * per_node * HOST_BUFFER_FACTOR)
    # stage 3 (DeepSpeed's stage-3 estimator, optimizer offload without parameter offload, zero_init)
    gpu3 = np.where(off, largest + np.floor(2 * shard / d), largest + np.floor(18 * shard / d))
    cpu3 = np.where(off, shard * 16 / batch.nodes * HOST_BUFFER_FACTOR,
                    largest_layer_params(model) * 4 * per_node * HOST_BUFFER_FACTOR)
    gpu = np.where(z == 0, gpu0, np.where(z == 3, gpu3, gpu2))
    cpu = np.where(z == 0, 0.0, np.where(z == 3, cpu3, cpu2))
    return gpu, cpu


def activation_bytes(model: ModelType, batch: ConfigBatch, ga: int | None = None) -> np.ndarray:
    """Activation memory per GPU of the micro-batches in flight on the first pipeline stage; with `ga` (>= 1), as if
    every configuration ran that many GA steps."""
    s = model.spec
    mb = batch.global_batch / (batch.dp * (np.maximum(batch.ga_steps, 1) if ga is None else ga) * batch.micro_batches)
    sbh = s.seq_len * mb * s.hidden_size
    full_layer = sbh * (34.0 + 5.0 * s.num_heads * s.seq_len / s.hidden_size) / batch.tp
    layers = np.ceil(s.num_layers / batch.pp)
    in_flight = np.minimum(batch.micro_batches, batch.pp)
    per_micro = np.where(batch.gc, 2.0 * sbh * layers + full_layer, full_layer * layers)
    logits = s.seq_len * mb * model.vocab_size * 6.0 / batch.tp
    return per_micro * in_flight + logits


def gpu_bytes(model: ModelType, batch: ConfigBatch) -> np.ndarray:
    return _gpu_bytes(model, batch, model_states_bytes(model, batch)[0])


def _gpu_bytes(model: ModelType, batch: ConfigBatch, states: np.ndarray, ga: int | None = None) -> np.ndarray:
    buckets = np.where(batch.zero_stage > 0, ZERO_BUCKET_BYTES, 0.0)
    return states + activation_bytes(model, batch, ga) + buckets + OVERHEAD_BYTES


def resolve_ga(model: ModelType, env: Environment, batch: ConfigBatch) -> ConfigBatch:
    """Fill in GA steps left to the modeler (0): the fewest that divide the per-rank batch and fit
    in GPU memory; the most (one sample per pass) where none fits."""
    return _resolve_ga(model, env, batch, None)[0]


def resolve_feasible(model: ModelType, env: Environment, batch: ConfigBatch) -> tuple[ConfigBatch, np.ndarray]:
    """`resolve_ga`, then `feasible` of what it resolved: the model states (which do not depend on the GA steps)
    worked out once for both, as is each row's GPU memory at the GA steps it is resolved at."""
    states = model_states_bytes(model, batch)
    resolved, used = _resolve_ga(model, env, batch, states[0])
    return resolved, feasible(model, env, resolved, states=states, gpu=used)


def _resolve_ga(model: ModelType, env: Environment, batch: ConfigBatch,
                states: np.ndarray | None) -> tuple[ConfigBatch, np.ndarray | None]:
    """`resolve_ga`; `states`: the batch's GPU bytes of model states where known (they do not depend on the GA
    steps). Each count is tried on every row at once (up to `_WHOLE_ROWS`), the rows it does not divide or that are
    resolved already left out of what it decides: each row's bytes are worked out on their own, so they are the same
    as on the rows alone, and on a batch of tens of rows an array operation costs the same on all of them as on a few.
    With the batch, each row's GPU bytes at its steps (`_gpu_bytes` of the resolved batch; None where no row had its
    steps left open)."""
    auto = batch.ga_steps == 0
    if not auto.any():
        return batch, None
    if states is None:
        states = model_states_bytes(model, batch)[0]
    per_rank = np.maximum(1, batch.global_batch // (batch.dp * batch.micro_batches)).astype(np.int64)
    ga = np.where(auto, 0, batch.ga_steps)
    limit = USABLE_FRACTION * env.gpu_mem_gb * GB
    used = np.empty(len(batch))
    work, work_states, work_rank, left, at = batch, states, per_rank, auto, None
    """the rows still tried (all of the batch, or those left: `at`, their positions in it) and which are left"""
    for a in _divisors_of(tuple(sorted(set(per_rank[auto].tolist())))):  # no other count divides a row's batch
        todo = left & (work_rank % a == 0)
        if not todo.any():
            continue
        need = _gpu_bytes(model, work, work_states, a)
        now = todo & ((need <= limit) | (work_rank == a))
        rows = now if at is None else at[now]
        ga[rows] = a
        used[rows] = need[now]
        left = left & ~now
        n_left = int(np.count_nonzero(left))
        if not n_left:
            break  # every one resolved (a row's own per-rank batch resolves it at the latest)
        if len(work) > _WHOLE_ROWS and 4 * n_left < len(work):  # a few left of a large batch: those alone from now on
            keep = np.flatnonzero(left)
            work, work_states, work_rank = work.take(keep), work_states[keep], work_rank[keep]
            at, left = (keep if at is None else at[keep]), np.ones(len(keep), dtype=bool)
    resolved = ConfigBatch(**{**batch.__dict__, "ga_steps": ga})
    if not auto.all():  # the steps given: the bytes at those
        used[~auto] = _gpu_bytes(model, batch, states)[~auto]
    return resolved, used


_WHOLE_ROWS = 256
"""`_resolve_ga` tries each count on every row of a batch up to this size (an array operation costs about the same on
a few rows as on this many); on a larger one, once fewer than a quarter of its rows are left, on those rows alone"""


@lru_cache(maxsize=1024)
def _divisors_of(per_rank: tuple[int, ...]) -> tuple[int, ...]:
    """Every count that divides one of the per-rank batches, lowest first: the GA steps `_resolve_ga` tries. A count
    dividing none would find no row to try (a batch of 256 samples per rank has 9 divisors, not 256)."""
    return tuple(sorted({d for n in per_rank for d in divisors(n)}))


def host_bytes(model: ModelType, batch: ConfigBatch) -> np.ndarray:
    """Host memory the job needs for its model states (all nodes together)."""
    return model_states_bytes(model, batch)[1]


def feasible(model: ModelType, env: Environment, batch: ConfigBatch,
             host_mem_gb: np.ndarray | float | None = None,
             states: tuple[np.ndarray, np.ndarray] | None = None, gpu: np.ndarray | None = None) -> np.ndarray:
    """True where the plan fits in GPU memory and, under ZeRO-Offload, in host memory.

    `host_mem_gb` is the host memory given to the job (all nodes together); by default all of the
    nodes it uses. `states`: `model_states_bytes` of the batch, and `gpu` its `gpu_bytes`, where already worked out.
    """
    # once for both: `gpu_bytes` and `host_bytes` each read it
    states, on_host = model_states_bytes(model, batch) if states is None else states
    if gpu is None:
        gpu = _gpu_bytes(model, batch, states)
    fits_gpu = gpu <= USABLE_FRACTION * env.gpu_mem_gb * GB
    host = batch.nodes * env.host_mem_gb if host_mem_gb is None else np.asarray(host_mem_gb, dtype=np.float64)
    fits_host = on_host <= host * GB
    whole_batch = batch.global_batch >= batch.dp * np.maximum(batch.ga_steps, 1) * batch.micro_batches
    return fits_gpu & fits_host & whole_batch


def deepspeed_model_states(total_params: float, largest_layer: float, gpus_per_node: int, nodes: int,
                           zero_stage: int, offload: bool) -> tuple[int, int] | None:
    """(host bytes, GPU bytes) from DeepSpeed's own estimator, or None where DeepSpeed is absent."""
    try:
        z2, z3 = _deepspeed_estimators()
    except ImportError:
        return None
    if zero_stage == 3:
        cpu, gpu, _ = z3(int(total_params), int(largest_layer), num_gpus_per_node=gpus_per_node, num_nodes=nodes,
                         cpu_offload=offload, cpu_offload_params=False, zero_init=True,
                         additional_buffer_factor=HOST_BUFFER_FACTOR)
        return int(cpu), int(gpu)
    cpu, gpu = z2(int(total_params), num_gpus_per_node=gpus_per_node, num_nodes=nodes, cpu_offload=offload,
                  additional_buffer_factor=HOST_BUFFER_FACTOR)
    return int(cpu), int(gpu)


def _deepspeed_estimators() -> tuple[Callable, Callable]:
    import logging
    import os

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    return estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs
