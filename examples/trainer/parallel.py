"""Tensor and pipeline parallelism for the example trainer, with torch's own building blocks.

A plan with `tp > 1` or `pp > 1` runs here instead of under DeepSpeed (`train.py` picks):

- the ranks form a (dp, pp, tp) device mesh, tensor parallelism innermost, so a TP group is on one
  node as the policy lays plans out; on the CPU under gloo, or on each rank's GPU under NCCL;
- **TP** (`torch.distributed.tensor.parallel`): in every block, `q`, `k`, `v` and the MLP's first layer
  are split by output (ColwiseParallel: each rank computes its heads), `proj` and the MLP's second
  layer by input (RowwiseParallel: one all-reduce after each); embeddings, norms and the output layer
  are replicated;
- **PP** (`torch.distributed.pipelining`): stage `s` of `pp` runs an equal share of the blocks
  (`model.Stage`), the plan's `micro_batches` per gradient-accumulation step, on a 1F1B schedule
  (GPipe when there are fewer micro-batches than stages);
- **DP** over the replicas: gradients averaged with an all-reduce per parameter over the DP group;
- gradient accumulation (`ga_steps`), gradient checkpointing (`gc`, per block), gradient clipping at
  1.0 over the global norm and AdamW with DeepSpeed path's settings, so both paths train alike.

ZeRO and ZeRO-Offload are DeepSpeed's and do not compose with these modules: the trainer refuses
`zero_stage > 0` or `offload` together with `tp > 1` or `pp > 1` (`agents.plan_check` refuses the same,
and the policy never decides it: `controlplane.events.workload.EXAMPLE_TRAINER`).

The checkpoint is the plan-independent one of `agents.checkpoint` (`save_owned`, `load_owned`): a job
moves between these plans and DeepSpeed's in both directions.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from controlplane.events import Plan

from .model import Stage, TinyGPT, loss_of

TP_PLAN = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "proj": RowwiseParallel(),
           "mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()}
"""How each block is split across a tensor-parallel group."""
MAX_GRAD_NORM = 1.0
BETAS = (0.9, 0.95)
EPS = 1e-8


class PlanUnsupported(ValueError):
    """A plan this trainer cannot run on this model (the message says why)."""


def check(plan: Plan, model: TinyGPT, global_batch: int) -> None:
    """Refuse what cannot run: ZeRO with TP/PP, TP not dividing the heads, PP not dividing the layers,
    micro-batches not dividing a replica's batch per accumulation step."""
    heads, layers = model.cfg.heads, model.cfg.layers
    if plan.zero_stage or plan.offload:
        raise PlanUnsupported("ZeRO and ZeRO-Offload run only without tensor or pipeline parallelism "
                              f"(plan {plan.code()})")
    if heads % plan.tp:
        raise PlanUnsupported(f"tp = {plan.tp} does not divide the model's {heads} attention heads")
    if layers % plan.pp:
        raise PlanUnsupported(f"pp = {plan.pp} does not divide the model's {layers} layers")
    per_step, rest = divmod(global_batch, plan.dp * plan.ga_steps)
    if rest:
        raise PlanUnsupported(f"the global batch {global_batch} does not split into dp*ga_steps = "
                              f"{plan.dp * plan.ga_steps} equal parts")
    if per_step % plan.micro_batches:
        raise PlanUnsupported(f"micro_batches = {plan.micro_batches} does not divide a replica's batch of "
                              f"{per_step} per accumulation step")


@dataclass
class Parallel:
    """One rank's part of a 3D-parallel model and how it trains."""

    plan: Plan
    model: TinyGPT
    mesh: Any
    stage: torch.nn.Module
    params: dict[str, torch.nn.Parameter]
    """this rank's parameters by whole-model name"""
    optimizer: torch.optim.Optimizer
    schedule: Any = None
    dp_rank: int = 0
    pp_rank: int = 0
    tp_rank: int = 0
    groups: dict[str, Any] = field(default_factory=dict)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def first(self) -> bool:
        return self.pp_rank == 0

    @property
    def last(self) -> bool:
        return self.pp_rank == self.plan.pp - 1

    @property
    def contributes(self) -> bool:
        """Whether this rank's parameters go into the checkpoint (one replica of each part)."""
        return self.dp_rank == 0 and self.tp_rank == 0


def build(plan: Plan, model: TinyGPT, global_batch: int, *, lr: float) -> Parallel:
    """Split `model` (built identically on every rank) for this rank under `plan`; collective."""
    check(plan, model, global_batch)
    # the processes' device: this rank's GPU under NCCL, the CPU under gloo
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    model.to(device)
    mesh = init_device_mesh(device.type, (plan.dp, plan.pp, plan.tp), mesh_dim_names=("dp", "pp", "tp"))
    if plan.tp > 1:
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], TP_PLAN)
    pp_rank = mesh["pp"].get_local_rank()
    stage = Stage(model, pp_rank, plan.pp)
    params = dict(stage.named_parameters())
    optimizer = torch.optim.AdamW(list(params.values()), lr=lr, betas=BETAS, eps=EPS, weight_decay=0.0,
                                  foreach=False)
    out = Parallel(plan, model, mesh, stage, params, optimizer, dp_rank=mesh["dp"].get_local_rank(),
                   pp_rank=pp_rank, tp_rank=mesh["tp"].get_local_rank(),
                   groups={k: mesh[k].get_group() for k in ("dp", "pp", "tp")}, device=device)
    if plan.pp > 1:
        pipe = PipelineStage(stage, pp_rank, plan.pp, device, group=out.groups["pp"])
        kind = Schedule1F1B if plan.micro_batches >= plan.pp else ScheduleGPipe
        # grads are scaled here (over micro-batches and accumulation steps), not by the schedule
        out.schedule = kind(pipe, n_microbatches=plan.micro_batches, loss_fn=loss_of, scale_grads=False)
    return out


def train_step(par: Parallel, batches: list[tuple[torch.Tensor, torch.Tensor]], reporter=None) -> float:
    """One iteration: forward and backward over this replica's accumulation steps (`batches`), gradients
    averaged over the replicas and clipped, one AdamW step. Returns the iteration's mean loss (the same on
    every rank)."""
    plan = par.plan
    par.stage.train()
    for p in par.params.values():
        p.grad = None
    loss_sum = torch.zeros(1)
    phase = reporter.phase if reporter is not None else (lambda name: contextlib.nullcontext())
    for x, y in batches:
        x, y = x.to(par.device), y.to(par.device)
        if par.schedule is None:
            with phase("fwd"):
                loss = loss_of(par.stage(x), y)
            with phase("bwd"):
                (loss / plan.ga_steps).backward()
            loss_sum += float(loss.detach())
        else:
            losses: list[torch.Tensor] = []
            with phase("bwd"):  # forward and backward interleave in the pipeline
                if par.first:
                    par.schedule.step(x)
                elif par.last:
                    par.schedule.step(target=y, losses=losses)
                else:
                    par.schedule.step()
            if losses:
                loss_sum += float(torch.stack([loss.detach() for loss in losses]).mean())
    with phase("opt"):
        scale = 1.0 / plan.ga_steps if par.schedule is None else 1.0 / (plan.ga_steps * plan.micro_batches)
        for p in par.params.values():
            if p.grad is None:
                continue
            g = _local(p.grad)
            if par.schedule is not None:
                g.mul_(scale)
            if plan.dp > 1:
                dist.all_reduce(g, group=par.groups["dp"])
                g.div_(plan.dp)
        _clip(par)
        par.optimizer.step()
    # the loss the last stage saw, averaged over the replicas, on every rank
    mine = (loss_sum / plan.ga_steps if (par.last and par.tp_rank == 0) else torch.zeros(1)).to(par.device)
    dist.all_reduce(mine)
    return float(mine.cpu()) / plan.dp


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _clip(par: Parallel) -> None:
    """Clip the gradients to `MAX_GRAD_NORM` over the whole model's global norm (shards summed over the
    TP group, stages over the PP group; replicated parameters counted once)."""
    sharded = torch.zeros(1, dtype=torch.float64, device=par.device)
    whole = torch.zeros(1, dtype=torch.float64, device=par.device)
    for p in par.params.values():
        if p.grad is None:
            continue
        sq = _local(p.grad).double().pow(2).sum()
        if isinstance(p.grad, DTensor) and any(isinstance(pl, Shard) for pl in p.grad.placements):
            sharded += sq
        else:
            whole += sq
    if par.plan.tp > 1:
        dist.all_reduce(sharded, group=par.groups["tp"])
    total = sharded + whole
    if par.plan.pp > 1:
        dist.all_reduce(total, group=par.groups["pp"])
    norm = math.sqrt(float(total))
    coef = MAX_GRAD_NORM / (norm + 1e-6)
    if coef < 1.0:
        for p in par.params.values():
            if p.grad is not None:
                _local(p.grad).mul_(coef)
