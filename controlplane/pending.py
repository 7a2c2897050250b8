"""Pending reasons in words: the policy's `plan.pending` entries as `rubick status` and `rubick explain`
show them (the closed set is `controlplane.events.payloads.PENDING_REASONS`, documented in docs/policy.md)."""

from __future__ import annotations

from .events.payloads import PENDING_REASONS, Pending


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def short(p: Pending) -> str:
    """A few words for the status table."""
    running = p.gpus > 0
    if p.reason == "no-gpus":
        return f"runs on {_gpus(p.gpus)}: no more free" if running else \
            f"no GPUs free for its minimum of {_gpus(p.needs_gpus)}"
    if p.reason == "quota":
        quota = int(p.detail.get("quota", "0"))
        if quota == 0:
            return "its tenant has no quota: best-effort"
        return f"its tenant's quota is used up ({p.detail.get('quota_used', '?')} of {_gpus(quota)}): best-effort"
    if p.reason == "no-fit":
        return "no plan fits in memory on the free nodes"
    if p.reason == "held":
        return "held by the restart rule"
    if p.reason == "batch":
        return "waiting for the next batched round"
    return p.reason


def sentence(p: Pending, restart_cost_s: float | None = None, batch_s: float | None = None) -> str:
    """Plain sentences with units, for `rubick explain`."""
    now = f"It holds {_gpus(p.gpus)}" if p.gpus else "It holds no GPUs"
    need = f"the fewest it can start on is {_gpus(p.needs_gpus)}" if p.needs_gpus else ""
    if p.reason == "no-gpus":
        why = ("the free GPUs, and those held by jobs that would gain less from them, are fewer than it needs"
               if not p.gpus else "no more GPUs are free, and the jobs holding them would lose more than it gains")
    elif p.reason == "quota":
        quota = int(p.detail.get("quota", "0"))
        why = ("its tenant has no guaranteed quota, so it competes as a best-effort job" if quota == 0 else
               f"its tenant's guaranteed quota of {_gpus(quota)} is used up ({p.detail.get('quota_used', '?')} GPUs "
               "charged to its guaranteed jobs), so it competes as a best-effort job")
    elif p.reason == "no-fit":
        why = "GPUs are free, but no execution plan of it fits in GPU memory, CPUs or host memory on the free nodes"
    elif p.reason == "held":
        cost = f" of {restart_cost_s:g} s" if restart_cost_s is not None else ""
        why = ("the GPUs it needs belong to jobs changed too recently to be restarted again, or the time a change "
               f"would save does not pay for the restart{cost} (the restart rule)")
    elif p.reason == "batch":
        every = f" (at most {batch_s:g} s away)" if batch_s else ""
        why = f"the cluster was full when it arrived, so it waits for the next batched scheduling round{every}"
    else:
        why = p.reason
    return f"{now}: {why}." + (f" {need[0].upper()}{need[1:]}." if need else "")


__all__ = ["PENDING_REASONS", "short", "sentence"]
