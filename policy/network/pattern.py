"""The flows one training iteration puts on the network, from a job's plan and placement.

Ranks are laid out as the modeler lays them out (`modeler.configs.layout`): tensor-parallel
innermost, then data-parallel, then pipeline stages, filling the placement's nodes in order. Only
traffic between two different nodes is a flow; tensor-parallel groups stay inside a node (a plan
whose TP group crosses nodes is refused before it gets here). Flows are node to node: the ranks of
a node that send to the same other node at the same time are one flow. Bytes, with P parameters,
G = 2P bytes of 16-bit gradients (G_s = G / p for one of p stages), b the global batch, s the
sequence length and h the hidden size:

- DP gradient all-reduce (plain DP, after the backward): a ring over the stage's ranks; every ring
  edge between two nodes carries 2 (d - 1) / d * G_s (the t rings of the t tensor-parallel ranks
  together); one Coflow per stage.
- ZeRO stages 1-2 and ZeRO-Offload: a reduce-scatter after the backward and an all-gather of the
  updated parameters after the optimizer step, each (d - 1) / d * G_s per ring edge; one Coflow each.
- ZeRO-3 (FSDP): the layers in U = min(layers, 8) units; before each unit's forward and again
  before its backward an all-gather of its parameters, after its backward a reduce-scatter of its
  gradients, each (d - 1) / d * G / U per ring edge. The all-gather of the next unit is released as
  the current unit's compute starts (prefetch). All all-gathers form one EchelonFlow (Eq. S12:
  spaced by a unit's forward, then by its backward), all reduce-scatters another (spaced by a unit's
  backward).
- PP (GPipe: every micro-batch forward, then every backward): per micro-batch, activations from
  stage i to i + 1 and their gradients back, 2 * (b / (d m)) * s * h bytes per data-parallel
  replica whose two stages are on different nodes. Per stage boundary and direction one
  EchelonFlow (Eq. S8): micro-batch j's flow ideally finishes j times the receiving stage's
  per-micro-batch compute after the first. At most `MAX_MICRO` micro-batches are modelled;
  consecutive ones are merged beyond that (bytes and compute add up).

Compute durations come from the modeler's performance model (`modeler.perf_model.parts`): per
micro-batch and stage, forward t_fwd / (a (m + p - 1)) and backward t_bwd / (a (m + p - 1)) for a
GA steps (the GA steps of an iteration run back to back, the DP synchronisation after the last);
the optimizer step (and offload) t_oo - t_ag + k_const after the synchronisation.
Pure code: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from controlplane.events import Plan
from modeler.configs import Config, ConfigBatch, ConfigError, check_config
from modeler.env import Environment
from modeler.perf_model import GRAD_BYTES, PerfParams, parts
from modeler.spec import ModelType

from .echelon import fsdp_offsets
from .fluid import Pattern, Task
from .topology import NetworkError

MAX_MICRO = 32
FSDP_UNITS = 8


@dataclass(frozen=True)
class Timing:
    """Seconds of compute, from the performance model."""

    fwd_mb: float
    """forward of one micro-batch on one stage (the whole forward of a GA step without PP)"""
    bwd_mb: float
    tail: float
    """optimizer step (and offload traffic) after the synchronisation"""
    ga_steps: int = 1


def timing(model: ModelType, env: Environment, params: PerfParams, plan: Plan, gpus_per_node: tuple[int, ...],
           global_batch: int, cpus_per_gpu: int | None = None) -> Timing:
    cfg = Config(plan=plan, gpus_per_node=tuple(gpus_per_node), cpus_per_gpu=cpus_per_gpu,
                 global_batch_size=global_batch)
    batch = ConfigBatch.from_configs([cfg], allow_tp_across_nodes=model.allow_tp_across_nodes)
    pt = parts(model, env, params, batch)
    a = max(plan.ga_steps, 1)
    steps = a * (plan.micro_batches + plan.pp - 1)
    tail = float(pt.t_oo[0] - pt.t_ag[0]) + params.k_const
    return Timing(float(pt.t_fwd[0]) / steps, float(pt.t_bwd[0]) / steps, max(tail, 0.0), a)


class _Builder:
    def __init__(self, job: str) -> None:
        self.job = job
        self.tasks: list[Task] = []
        self.echelons: list[str] = []

    def echelon(self, what: str) -> int:
        self.echelons.append(what)
        return len(self.echelons) - 1

    def compute(self, seconds: float, after: Sequence[int]) -> int:
        self.tasks.append(Task(after=tuple(sorted(set(after))), duration=max(float(seconds), 0.0)))
        return len(self.tasks) - 1

    def flows(self, edges: dict[tuple[str, str], float], echelon: int, offset: float, after: Sequence[int]) -> list[int]:
        out = []
        for (src, dst), size in sorted(edges.items()):
            if size > 0:
                self.tasks.append(Task(after=tuple(sorted(set(after))), src=src, dst=dst, size=float(size),
                                       echelon=echelon, offset=float(offset)))
                out.append(len(self.tasks) - 1)
        return out

    def pattern(self, weight: float = 1.0, klass: int = 0) -> Pattern:
        return Pattern(self.job, tuple(self.tasks), tuple(self.echelons), weight, klass)


def rank_nodes(placement: Sequence[tuple[str, int]], plan: Plan) -> np.ndarray:
    """node name of every rank, shaped (pp, dp, tp)."""
    names = [n for n, g in placement for _ in range(g)]
    if len(names) != plan.gpus:
        raise NetworkError(f"the placement has {len(names)} GPUs, the plan needs {plan.gpus}")
    return np.asarray(names, dtype=object).reshape(plan.pp, plan.dp, plan.tp)


def ring_edges(nodes: Sequence[str], per_edge: float) -> dict[tuple[str, str], float]:
    """The node-to-node edges of a ring over ranks on `nodes` (in rank order), `per_edge` bytes each."""
    edges: dict[tuple[str, str], float] = {}
    n = len(nodes)
    for i in range(n):
        a, b = nodes[i], nodes[(i + 1) % n]
        if a != b:
            edges[(a, b)] = edges.get((a, b), 0.0) + per_edge
    return edges


def iteration_pattern(job: str, plan: Plan, placement: Sequence[tuple[str, int]], model: ModelType,
                      timing: Timing, global_batch: int, *, weight: float = 1.0, klass: int = 0) -> Pattern | None:
    """One iteration of the job as compute tasks and flows; None when no flow leaves a node (a job on one
    node, or whose groups all stay inside nodes: nothing to schedule on the network)."""
    placement = [(n, int(g)) for n, g in placement if g > 0]
    if not placement:
        raise NetworkError(f"job {job}: an empty placement")
    if len({n for n, _ in placement}) != len(placement):
        raise NetworkError(f"job {job}: a node appears twice in the placement")
    try:
        check_config(Config(plan, tuple(g for _, g in placement), None, global_batch),
                     allow_tp_across_nodes=False)
    except ConfigError as exc:
        raise NetworkError(f"job {job}: {exc.detail}") from None
    if len(placement) == 1:
        return None
    spec = model.spec
    nodes = rank_nodes(placement, plan)
    d, p = plan.dp, plan.pp
    grad = GRAD_BYTES * float(spec.num_params)
    b = _Builder(job)
    ga = max(timing.ga_steps, 1)
    if p == 1:
        ring = list(nodes[0, :, 0])
        if plan.zero_stage == 3 and not plan.offload:
            _fsdp(b, ring, d, grad, timing, spec.num_layers)
        else:
            last = b.compute(ga * (timing.fwd_mb + timing.bwd_mb), [])
            _sync(b, plan, ring, d, grad, timing, [last], "")
    else:
        _pipeline(b, plan, nodes, grad, timing, global_batch, spec.seq_len * spec.hidden_size)
    if not b.echelons or not any(t.is_flow for t in b.tasks):
        return None
    return b.pattern(weight, klass)


def _sync(b: _Builder, plan: Plan, ring: list[str], d: int, grad: float, timing: Timing, after: list[int],
          stage: str) -> int:
    """DP synchronisation and optimizer step after the backward; returns the last task."""
    crosses = len(set(ring)) > 1 and d > 1
    if not crosses:
        return b.compute(timing.tail, after)
    if plan.zero_stage == 0:
        e = b.echelon(f"dp all-reduce{stage}")
        ar = b.flows(ring_edges(ring, 2.0 * (d - 1) / d * grad), e, 0.0, after)
        return b.compute(timing.tail, ar or after)
    e = b.echelon(f"zero reduce-scatter{stage}")
    rs = b.flows(ring_edges(ring, (d - 1) / d * grad), e, 0.0, after)
    opt = b.compute(timing.tail, rs or after)
    e = b.echelon(f"zero all-gather{stage}")
    ag = b.flows(ring_edges(ring, (d - 1) / d * grad), e, 0.0, [opt])
    return b.compute(0.0, ag or [opt])


def _fsdp(b: _Builder, ring: list[str], d: int, grad: float, timing: Timing, layers: int) -> None:
    units = max(1, min(layers, FSDP_UNITS))
    ga = max(timing.ga_steps, 1)
    fwd, bwd = ga * timing.fwd_mb / units, ga * timing.bwd_mb / units
    per_edge = (d - 1) / d * grad / units * ga
    edges = ring_edges(ring, per_edge)
    offsets = fsdp_offsets(units, fwd, bwd)
    ag = b.echelon("fsdp all-gathers")
    rs = b.echelon("fsdp reduce-scatters")
    gate: list[int] = []   # what the next unit's compute (and the prefetch of the one after) waits for
    prev = b.flows(edges, ag, offsets[0], [])
    compute: list[int] = []
    for u in range(units):
        start_after = prev + gate
        nxt = b.flows(edges, ag, offsets[u + 1], gate) if u + 1 < units else []
        c = b.compute(fwd, start_after)
        compute.append(c)
        gate, prev = [c], nxt
    # backward, last unit first; its all-gather prefetched as the last forward starts
    prev = b.flows(edges, ag, offsets[units], [compute[-2]] if units > 1 else [])
    rs_flows: list[int] = []
    for k, u in enumerate(reversed(range(units))):
        start_after = prev + gate
        nxt = b.flows(edges, ag, offsets[units + k + 1], gate) if k + 1 < units else []
        c = b.compute(bwd, start_after)
        rs_flows += b.flows(edges, rs, k * bwd, [c])
        gate, prev = [c], nxt
    b.compute(timing.tail, rs_flows + gate)


def _pipeline(b: _Builder, plan: Plan, nodes: np.ndarray, grad: float, timing: Timing, global_batch: int,
              sh: float) -> None:
    d, p = plan.dp, plan.pp
    micro = max(plan.ga_steps, 1) * plan.micro_batches
    merged = -(-micro // MAX_MICRO)
    m = -(-micro // merged)
    scale = micro / m
    fwd, bwd = timing.fwd_mb * scale, timing.bwd_mb * scale
    act = GRAD_BYTES * global_batch / (d * micro) * sh * scale
    # per boundary: the node pairs that carry it (summed over the replicas)
    fwd_edges, bwd_edges = [], []
    for s in range(p - 1):
        e: dict[tuple[str, str], float] = {}
        for r in range(d):
            src, dst = nodes[s, r, 0], nodes[s + 1, r, 0]
            if src != dst:
                e[(src, dst)] = e.get((src, dst), 0.0) + act
        fwd_edges.append(e)
        bwd_edges.append({(dst, src): v for (src, dst), v in e.items()})
    F = [[0] * m for _ in range(p)]
    for s in range(p):
        e_in = b.echelon(f"pipeline activations {s - 1}->{s}") if s > 0 and fwd_edges[s - 1] else None
        for j in range(m):
            after = [F[s][j - 1]] if j else []
            if s > 0:
                if e_in is not None:
                    after += b.flows(fwd_edges[s - 1], e_in, j * fwd, [F[s - 1][j]])
                else:
                    after.append(F[s - 1][j])
            F[s][j] = b.compute(fwd, after)
    B = [[0] * m for _ in range(p)]
    for s in reversed(range(p)):
        e_in = b.echelon(f"pipeline gradients {s + 1}->{s}") if s < p - 1 and bwd_edges[s] else None
        for j in range(m):
            after = [B[s][j - 1]] if j else [F[s][m - 1]]
            if s < p - 1:
                if e_in is not None:
                    after += b.flows(bwd_edges[s], e_in, j * bwd, [B[s + 1][j]])
                else:
                    after.append(B[s + 1][j])
            B[s][j] = b.compute(bwd, after)
    for s in range(p):
        _sync(b, plan, list(nodes[s, :, 0]), d, grad / p, timing, [B[s][m - 1]], f" stage {s}")
