"""Plan enumeration: every execution plan a model can run on a placement.

A placement is the GPUs used on each node, e.g. `(8, 8, 4)`. The plans keep the global batch
constant and respect:

- DP-family plans (`dp`, `gc`, `zero-dp`, `zero-offload`, `zero-offload+gc`): DP over every GPU of
  the placement; the global batch divisible by DP. GA steps are left to the oracle, which picks
  the fewest that fit in GPU memory (`ga_steps` is 1 in the enumerated plan).
- 3D plans (`3d`, Megatron-style TP x PP x DP, ZeRO stage 0): TP divides the attention heads and
  stays inside a node (ranks are laid out TP innermost, so TP must divide every node's GPU count),
  PP divides the layers, the global batch is divisible by DP, and PP runs one sample per
  micro-batch (`micro_batches` = global batch / DP). Only for models with a tensor/pipeline
  implementation (`ModelType.tensor_pipeline`).

Memory feasibility is the oracle's part (`policy.oracle`): an enumerated plan the oracle marks
infeasible is never chosen. Pure code, cached: the same (model, batch, placement, families) always
gives the same list in the same order.

A placement enters the plans only through its GPU count and whether TP fits inside its nodes. Ranks fill the
nodes in order with TP innermost, so a TP group (`tp` ranks in a row, starting at a multiple of `tp`) crosses
a node exactly where some node boundary is not a multiple of `tp`: TP fits where it divides every node's count,
that is their greatest common divisor. The plans of a placement are therefore those of its `shape` (GPUs,
that divisor), and placements of one shape share them (a search trims allocations to thousands of placements
of a few dozen shapes).
"""

from __future__ import annotations

import math
from functools import lru_cache

from controlplane.events import Plan
from modeler.configs import divisors
from modeler.spec import ModelType

DP_FAMILIES = ("dp", "gc", "zero-dp", "zero-offload", "zero-offload+gc")
ALL_FAMILIES = ("3d",) + DP_FAMILIES

_DP_PLANS = {
    "dp": dict(zero_stage=0),
    "gc": dict(zero_stage=0, gc=True),
    "zero-dp": dict(zero_stage=2),
    "zero-offload": dict(zero_stage=2, offload=True),
    "zero-offload+gc": dict(zero_stage=2, offload=True, gc=True),
}


def family(plan: Plan) -> str:
    """The family a plan belongs to (one of `ALL_FAMILIES`, or `other`)."""
    if plan.tp > 1 or plan.pp > 1:
        return "3d" if plan.zero_stage == 0 and not plan.offload else "other"
    if plan.offload:
        return "zero-offload+gc" if plan.gc else "zero-offload"
    if plan.zero_stage == 2:
        return "zero-dp" if not plan.gc else "other"
    if plan.zero_stage == 0:
        return "gc" if plan.gc else "dp"
    return "other"


def canonical(placement) -> tuple[int, ...]:
    """A placement with empty nodes dropped, largest node first (plans depend only on this)."""
    if type(placement) is tuple:
        hit = _CANONICAL.get(placement)
        if hit is None:
            hit = tuple(sorted((int(g) for g in placement if g > 0), reverse=True))
            if len(_CANONICAL) < 1 << 16:
                _CANONICAL[placement] = hit
        return hit
    return tuple(sorted((int(g) for g in placement if g > 0), reverse=True))


_CANONICAL: dict[tuple, tuple[int, ...]] = {}


def shape(placement) -> tuple[int, int]:
    """(GPUs, the greatest common divisor of the nodes' counts): all a placement's plans depend on (see above)."""
    if type(placement) is tuple and min(placement, default=1) > 0:  # canonical, as the searches' trims are
        return sum(placement), math.gcd(*placement)
    gpus = [int(g) for g in placement if g > 0]
    return sum(gpus), math.gcd(*gpus)


def enumerate_plans(model: ModelType, global_batch: int, placement: tuple[int, ...],
                    families: tuple[str, ...] = ALL_FAMILIES) -> tuple[Plan, ...]:
    """Every plan of `families` for `model` at `global_batch` on `placement`, in a stable order."""
    return _enumerate(model.spec.num_layers, model.spec.num_heads, model.tensor_pipeline,
                      global_batch, shape(placement), tuple(families))


@lru_cache(maxsize=1 << 16)
def _enumerate(layers: int, heads: int, tensor_pipeline: bool, global_batch: int,
               of: tuple[int, int], families: tuple[str, ...]) -> tuple[Plan, ...]:
    total, node_gcd = of
    if total < 1:
        return ()
    plans: list[Plan] = []
    if global_batch % total == 0:
        for fam in DP_FAMILIES:
            if fam in families:
                plans.append(Plan(dp=total, **_DP_PLANS[fam]))
    if "3d" in families and tensor_pipeline:
        for tp in divisors(total):
            if heads % tp:
                continue
            for pp in divisors(total // tp):
                if tp * pp == 1 or layers % pp:
                    continue
                dp = total // (tp * pp)
                if global_batch % dp:
                    continue
                if node_gcd % tp:  # a TP group would cross nodes
                    continue
                mb = global_batch // dp if pp > 1 else 1
                plans.append(Plan(dp=dp, tp=tp, pp=pp, micro_batches=mb))
    return tuple(plans)


def restrict(plans: tuple[Plan, ...], template: Plan, *, scale_dp: bool) -> tuple[Plan, ...]:
    """Plans of the same kind as `template` (its family; for 3D the same TP and PP): the plan space
    of a policy that keeps a job's execution plan and only scales its resources (along DP when
    `scale_dp`, otherwise at the template's exact degrees)."""
    fam = family(template)
    out = []
    for p in plans:
        if family(p) != fam:
            continue
        if fam == "3d" and (p.tp, p.pp) != (template.tp, template.pp):
            continue
        if not scale_dp and p.dp != template.dp:
            continue
        out.append(p)
    return tuple(out)
