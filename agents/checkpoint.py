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
