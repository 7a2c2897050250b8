"""A checkpoint that does not depend on the plan it was written under, for any DeepSpeed training code
(the example trainer, a workload's own script: docs/workloads.md).

DeepSpeed's own ZeRO checkpoints are split per data-parallel rank and refuse another
world size or ZeRO stage. This one holds, for every parameter by name, its full fp32
value and its full Adam moments (gathered with DeepSpeed's tensor-fragment API, the
basis of its universal checkpoints), plus the optimizer step and the iteration. Any
plan can resume from it: ZeRO 0-3, with or without offload, any DP size or GA split.

Saving and loading are collective: every rank calls them; rank 0 writes the file
(to a temporary name, then renamed, so a crash never leaves a torn checkpoint).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from deepspeed.utils import (safe_get_full_fp32_param, safe_get_full_optimizer_state, safe_set_full_optimizer_state)

MOMENTS = ("exp_avg", "exp_avg_sq")
FORMAT = 1


def _inner_optimizer(engine) -> torch.optim.Optimizer:
    """The torch optimizer doing the update (wrapped by ZeRO, bare without it)."""
    opt = engine.optimizer
    return opt.optimizer if hasattr(opt, "optimizer") and isinstance(opt.optimizer, torch.optim.Optimizer) else opt


def _is_zero(param: torch.nn.Parameter) -> bool:
    return hasattr(param, "ds_id") or hasattr(param, "_hp_mapping")


def _step(engine) -> int:
    for state in _inner_optimizer(engine).state.values():
        if "step" in state:
            return int(state["step"])
    return 0


def gather(engine, model: torch.nn.Module) -> dict[str, Any]:
    """Full parameters and moments, on every rank (collective under ZeRO)."""
    inner = _inner_optimizer(engine)
    params: dict[str, torch.Tensor] = {}
    moments: dict[str, dict[str, torch.Tensor]] = {k: {} for k in MOMENTS}
    for name, p in model.named_parameters():
        if _is_zero(p):
            params[name] = safe_get_full_fp32_param(p).detach().cpu().clone()
            for key in MOMENTS:
                try:
                    value = safe_get_full_optimizer_state(p, key)
                except (KeyError, ValueError):  # no optimizer step yet: no moments
                    value = None
                if value is not None:
                    moments[key][name] = value.detach().cpu().clone()
        else:
            params[name] = p.detach().float().cpu().clone()
            state = inner.state.get(p, {})
            for key in MOMENTS:
                if key in state:
                    moments[key][name] = state[key].detach().cpu().clone()
    return {"params": params, "moments": moments, "step": _step(engine)}


def save(path: Path, engine, model: torch.nn.Module, extra: dict[str, Any]) -> None:
    state = gather(engine, model)
    if dist.get_rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save({"format": FORMAT, **state, **extra}, tmp)
        os.replace(tmp, path)
    dist.barrier()


def read(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)


def load_weights(state: dict[str, Any], model: torch.nn.Module) -> None:
    """Before `deepspeed.initialize`: the module starts from the saved fp32 weights. Every parameter must
    be in the checkpoint; a state-dict entry that is no parameter of its own (a weight tied to another,
    such as a language model's output layer, or a buffer) keeps what the model built."""
    missing, unexpected = model.load_state_dict(state["params"], strict=False)
    params = dict(model.named_parameters())
    lost = [k for k in missing if k in params]
    if lost or unexpected:
        raise RuntimeError(f"checkpoint does not fit the model: missing {lost[:5]}, unexpected {unexpected[:5]}")


def load_optimizer(state: dict[str, Any], engine, model: torch.nn.Module) -> None:
    """After `deepspeed.initialize`: Adam moments and step, partitioned the way this plan needs."""
    inner = _inner_optimizer(engine)
    zero = engine.optimizer
    step = torch.tensor(float(state["step"]))
    # the tensors the optimizer updates: its groups' parameters, or ZeRO-3's flat fp32 partitions
    # (which it swaps into its groups one sub-group at a time)
    flats = [p for group in inner.param_groups for p in group["params"]]
    flats += [p for p in getattr(zero, "fp32_partitioned_groups_flat", []) if all(p is not q for q in flats)]
    for flat in flats:
        slot = inner.state[flat]
        slot["step"] = step.clone()
        for key in MOMENTS:
            slot.setdefault(key, torch.zeros_like(flat, memory_format=torch.preserve_format))
    if hasattr(zero, "_lazy_init_hp_params_optimizer_state"):  # ZeRO 1/2: link moments to parameters
        zero._hp_optimizer_states_linked = False
        zero._lazy_init_hp_params_optimizer_state()
    for name, p in model.named_parameters():
        for key in MOMENTS:
            value = state["moments"][key].get(name)
            if value is None:
                continue
            if _is_zero(p):
                safe_set_full_optimizer_state(p, value, key)
            else:
                inner.state[p][key].copy_(value)


# --- training code built on torch's own tensor and pipeline parallelism --------------------------------
# The same file, from code that shards parameters as DTensors (torch.distributed.tensor.parallel) and
# splits the model into pipeline stages (torch.distributed.pipelining) with a torch optimizer of the Adam
# family: each rank holds some parameters (its stage's), some of them as shards (its tensor-parallel
# part). Any plan resumes from what any other wrote, DeepSpeed's included.

def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind `t` (a DTensor's `full_tensor()`: collective over its mesh)."""
    from torch.distributed.tensor import DTensor
    if isinstance(t, DTensor):
        t = t.full_tensor()
    return t.detach().float().cpu().clone()


def gather_owned(params: dict[str, torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's parameters (`name -> parameter`, whole-model names), whole, with their Adam moments and
    the optimizer step. Collective over each DTensor's mesh: every rank of a tensor-parallel group calls it
    with its (same) names in the same order."""
    out: dict[str, Any] = {"params": {}, "moments": {k: {} for k in MOMENTS}, "step": 0}
    for name in sorted(params):
        p = params[name]
        out["params"][name] = _full(p)
        state = optimizer.state.get(p, {})
        for key in MOMENTS:
            if key in state:
                out["moments"][key][name] = _full(state[key])
        if "step" in state:
            out["step"] = int(state["step"])
    return out


def collect_owned(params: dict[str, torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                  contributes: bool) -> dict[str, Any] | None:
    """The whole model's state on rank 0 (None elsewhere), from ranks that each hold part of it. Collective:
    every rank calls it; those with `contributes` (one replica of each part: data-parallel rank 0,
    tensor-parallel rank 0 of each pipeline stage) send their part."""
    part = gather_owned(params, optimizer)
    parts: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(part if contributes else None, parts, dst=0)
    if dist.get_rank() != 0:
        return None
    merged: dict[str, Any] = {"params": {}, "moments": {k: {} for k in MOMENTS}, "step": 0}
    for got in (x for x in parts if x is not None):
        merged["params"].update(got["params"])
        for key in MOMENTS:
            merged["moments"][key].update(got["moments"][key])
        merged["step"] = max(merged["step"], got["step"])
    return merged


def save_owned(path: Path, params: dict[str, torch.nn.Parameter], optimizer: torch.optim.Optimizer,
               contributes: bool, extra: dict[str, Any]) -> None:
    """Write the plan-independent checkpoint from ranks that each hold part of the model (`collect_owned`);
    rank 0 writes the merged file atomically."""
    merged = collect_owned(params, optimizer, contributes)
    if merged is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save({"format": FORMAT, **merged, **extra}, tmp)
        os.replace(tmp, path)
    dist.barrier()


def _like(full: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """`full` laid out as `p` is: this rank's shard of a DTensor parameter, else the tensor itself."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    if isinstance(p, DTensor):
        return distribute_tensor(full.to(device=p.device_mesh.device_type, dtype=p.dtype), p.device_mesh,
                                 p.placements, src_data_rank=None)
    return full.to(device=p.device, dtype=p.dtype)


def load_owned(state: dict[str, Any], params: dict[str, torch.nn.Parameter],
               optimizer: torch.optim.Optimizer | None = None) -> None:
    """This rank's parameters (and, with `optimizer`, their Adam moments and step) from a plan-independent
    checkpoint; no communication. A parameter missing from the checkpoint, or of another shape, is an error
    naming it (a checkpoint of another model type)."""
    saved = state["params"]
    missing = [n for n in params if n not in saved]
    if missing:
        raise RuntimeError(f"checkpoint does not fit the model: missing {missing[:5]}")
    from torch.distributed.tensor import DTensor
    with torch.no_grad():
        for name, p in params.items():
            full = saved[name]
            shape = tuple(p.shape)
            if tuple(full.shape) != shape:
                raise RuntimeError(f"checkpoint does not fit the model: {name} is {tuple(full.shape)}, "
                                   f"the model's {shape}")
            value = _like(full, p)
            (p.to_local() if isinstance(p, DTensor) else p).copy_(value.to_local() if isinstance(value, DTensor)
                                                                  else value)
    if optimizer is None:
        return
    step = float(state["step"])
    for name, p in params.items():
        moments = {key: state["moments"][key].get(name) for key in MOMENTS}
        if any(m is None for m in moments.values()):
            continue  # written before the first optimizer step: Adam starts fresh
        optimizer.state[p] = {"step": torch.tensor(step), **{k: _like(m, p) for k, m in moments.items()}}
        # (the step stays a CPU scalar, as torch's Adam keeps it when not capturable)
