"""Best plans per placement and the resource sensitivity curves built from them.

A job's curves depend only on its *kind*: model type, global batch and the plan space its policy
allows. `PlanBook` caches, per kind and oracle version (a `model.updated` bumps it, which
invalidates everything cached for that type):

- `best(kind, placement, cpus_per_gpu)`: the fastest feasible plan on exactly that placement;
- `best_within(...)`: the same, also trying the placement with GPUs taken off its smallest nodes,
  for an allocation on which no plan uses every GPU (GPT-2's TP = 5 on a node with 8 GPUs);
- `gpu_curve(kind, cpus_per_gpu)`: throughput of the best plan at 0..max GPUs on the tightest
  placement (full nodes, then the remainder), as the running maximum: the curve stays flat where
  no plan is feasible or more GPUs would be slower (paper Fig. 6);
- `cpu_curve(kind, placement)`: throughput of the best plan at 1..max CPU threads per GPU.

Throughputs are samples per second. Pure code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from itertools import count
from typing import Sequence

import numpy as np

from controlplane.events import Plan
from controlplane.events.workload import PlanSupport
from modeler.configs import divisors
from modeler.spec import ModelType

from .oracle import Oracle
from .plans import ALL_FAMILIES, canonical, enumerate_plans, restrict, shape


@dataclass(frozen=True)
class JobKind:
    """What a job's plans and curves depend on."""

    model: ModelType
    global_batch: int
    families: tuple[str, ...] = ALL_FAMILIES
    template: Plan | None = None
    """When set, only plans of the template's kind (`plans.restrict`): a policy that keeps plans."""
    scale_dp: bool = True
    """With a template: may DP change with the GPU count (else the exact template)."""
    support: PlanSupport | None = None
    """What the job's training code runs (`controlplane.events.workload.support_of`): plans it refuses are
    never enumerated (None: no limit)."""

    def plans(self, placement: tuple[int, ...]) -> tuple[Plan, ...]:
        """The plans of this kind on `placement`, kept per shape in the kind (`plans.shape`: the GPUs and the largest
        count dividing every node's, all the plans depend on; at most `_PLANS_KEPT`): a search asks for the plans of
        every trim of the allocations it gathers, thousands of placements of a few dozen shapes."""
        held = self.__dict__.get("_plans")
        if held is None:
            held = self.__dict__["_plans"] = {}  # not a field: equality and hashing read only the fields
        of = shape(placement)
        plans = held.get(of)
        if plans is None:
            plans = enumerate_plans(self.model, self.global_batch, placement, self.families)
            if self.template is not None:
                plans = restrict(plans, self.template, scale_dp=self.scale_dp)
            if self.support is not None:
                plans = tuple(p for p in plans if self.support.refusal(p) is None)
            if len(held) < _PLANS_KEPT:
                held[of] = plans
        return plans

    def planned_trims(self, place: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        """The trims of canonical `place` (`trims`, in their order) on which this kind has plans, kept per placement
        (at most `_PLANS_KEPT`): most trims of an allocation have none (their GPUs do not split the batch), and a
        placement without plans has no best plan to offer (`PlanBook.best_within` passes over them)."""
        held = self.__dict__.get("_planned")
        if held is None:
            held = self.__dict__["_planned"] = {}
        out = held.get(place)
        if out is None:
            kept = self.__dict__.get("_plans", {})  # shape -> plans (`plans`), read here without the call
            found = []
            for t, of in _trim_shapes(place):
                plans = kept.get(of)
                if plans is None:
                    plans = self.plans(t)
                if plans:
                    found.append(t)
            out = tuple(found)
            if len(held) < _PLANS_KEPT:
                held[place] = out
        return out

    @cached_property
    def offload(self) -> bool:
        """Whether any plan of this kind runs on the CPUs (ZeRO-Offload)."""
        if self.support is not None and not self.support.offload:
            return False
        if self.template is not None:
            return self.template.offload
        return any(f.startswith("zero-offload") for f in self.families)

    @cached_property
    def cache_key(self) -> tuple:
        return (self.model.name, self.global_batch, self.families, self.template, self.scale_dp, self.support)


@dataclass(frozen=True)
class Best:
    throughput: float
    """samples/s; 0 when no plan is feasible."""
    plan: Plan | None
    placement: tuple[int, ...]
    """the placement the plan uses (canonical: largest node first)."""


NONE = Best(0.0, None, ())
_MISSING = object()
_PLANS_KEPT = 1 << 14
"""placements whose plans a kind keeps (`JobKind.plans`)"""
_KIND_KEYS: dict[tuple, int] = {}
"""a kind's `cache_key` and model version -> the number standing for them in a plan book's keys (`PlanBook._key`). The
whole key held a tuple of seven parts, hashed again at every look-up of the book's tables (tens of thousands in a
cluster's first round); a number hashes at once. Equal keys share their number, which is never given to another."""
_KIND_KEYS_KEPT = 1 << 16
"""keys `_KIND_KEYS` holds: past that it is emptied, and the kinds seen again take new numbers"""
_KIND_NUMBERS = count()
"""where `_KIND_KEYS`'s numbers come from: one never given before, even after it was emptied"""


def packed(gpus: int, node_gpus: int) -> tuple[int, ...]:
    """The tightest placement of `gpus`: full nodes, then the remainder."""
    full, rest = divmod(gpus, node_gpus)
    return (node_gpus,) * full + ((rest,) if rest else ())


def request_placements(gpus: int, node_gpus: int) -> list[tuple[int, ...]]:
    """Where a fixed-size request may run, best first: the packed placement, then the same GPUs
    split equally over more and more nodes (24 GPUs on 8-GPU nodes: 8;8;8, 6;6;6;6, 4;4;4;4;4;4,
    ...). A plan whose TP or PP does not fit the packed placement (GPT-2's TP = 5, a LLaMA-30B plan
    measured on six 4-GPU nodes) runs on one of the splits."""
    out = [packed(gpus, node_gpus)]
    for n in range(max(1, -(-gpus // node_gpus)), gpus + 1):
        if gpus % n == 0 and gpus // n <= node_gpus:
            p = (gpus // n,) * n
            if p not in out:
                out.append(p)
    return out


@lru_cache(maxsize=1 << 14)
def _trim_shapes(place: tuple[int, ...]) -> tuple[tuple[tuple[int, ...], tuple[int, int]], ...]:
    """Each of `_trims(place)` with its `plans.shape` (for any kind: `JobKind.planned_trims`): its GPUs, and the
    greatest common divisor of its nodes' counts. A placement's trims are itself and the trims of the placement one GPU
    fewer on its smallest node, so the list is that one's with this placement in front: the placements a cluster's
    first round asks for share most of their trims, each worked out once."""
    rest = _next_trim(place)
    head = ((place, (sum(place), math.gcd(*place))),)
    return head if rest is None else head + _trim_shapes(rest)


def _next_trim(place: tuple[int, ...]) -> tuple[int, ...] | None:
    """`place` one GPU fewer on its last (smallest) node, which goes where it had one; None where at most one GPU is
    left."""
    if sum(place) <= 1:
        return None
    last = place[-1] - 1
    return place[:-1] + (last,) if last else place[:-1]


def trims(placement: tuple[int, ...]) -> list[tuple[int, ...]]:
    """`placement` and the placements left by taking GPUs one at a time off its smallest nodes."""
    return list(_trims(canonical(placement)))


@lru_cache(maxsize=1 << 14)
def _trims(place: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    rest = _next_trim(place)
    return (place,) if rest is None else (place,) + _trims(rest)


@dataclass
class PlanBook:
    oracle: Oracle
    node_gpus: int = 8
    """GPUs of a full node (the tightest placements of the curves)."""
    max_gpus: int = 64
    """Largest GPU count a curve covers."""
    max_cpus_per_gpu: int = 12
    _best: dict = field(default_factory=dict)
    _gpu_curves: dict = field(default_factory=dict)
    _cpu_curves: dict = field(default_factory=dict)
    _derived: dict = field(default_factory=dict)
    _within: dict = field(default_factory=dict)
    evaluations: int = 0

    def _key(self, kind: JobKind) -> int:
        """The number standing for `kind` at its model's version in the book's keys (`_KIND_KEYS`)."""
        version = self.oracle.version(kind.cache_key[0])  # the model's name (a property: slower to read)
        held = kind.__dict__.get("_versioned")  # (version, number): found once per kind and version
        if held is None or held[0] != version:
            full = kind.cache_key + (version,)
            number = _KIND_KEYS.get(full)
            if number is None:
                if len(_KIND_KEYS) >= _KIND_KEYS_KEPT:
                    _KIND_KEYS.clear()  # a kind seen again then takes a new number: never one given before
                number = _KIND_KEYS[full] = next(_KIND_NUMBERS)
            held = (version, number)
            kind.__dict__["_versioned"] = held
        return held[1]

    def memo(self, kind: JobKind, what: tuple, compute):
        """A value derived from `kind`'s curves, cached until its model type is refitted."""
        key = (self._key(kind),) + what
        hit = self._derived.get(key, _MISSING)
        if hit is _MISSING:
            hit = self._derived[key] = compute()
        return hit

    def considered(self, kind: JobKind, placement: Sequence[int], cpus_per_gpu: int) -> list[tuple[Plan, float]]:
        """Every plan considered on `placement`, with its predicted seconds per iteration."""
        place = canonical(placement)
        plans = kind.plans(place)
        times, resolved = self.oracle.evaluate(kind.model, kind.global_batch, place, cpus_per_gpu, plans)
        self.evaluations += len(plans)
        return list(zip(resolved, (float(t) for t in times)))

    def _cpg(self, kind: JobKind, cpus_per_gpu: int) -> int:
        """CPUs per GPU as far as they matter: only ZeRO-Offload runs anything on the CPUs."""
        return min(max(1, cpus_per_gpu), self.max_cpus_per_gpu) if kind.offload else 1

    def best(self, kind: JobKind, placement: Sequence[int], cpus_per_gpu: int) -> Best:
        place = canonical(placement)
        cpus_per_gpu = self._cpg(kind, cpus_per_gpu)
        key = (self._key(kind), place, cpus_per_gpu)
        hit = self._best.get(key)
        if hit is None:
            self.fill(kind, [(place, cpus_per_gpu)])
            hit = self._best[key]
        return hit

    def fill(self, kind: JobKind, wanted: Sequence[tuple[tuple[int, ...], int]]) -> None:
        """Find the best plans of many (placement, CPUs per GPU) in one oracle call. A placement missed at one
        CPU count is evaluated at all of them; one without plans is settled (no plan) without asking. Where the
        oracle says the CPUs change only ZeRO-Offload's times (`cpus_offload_only`), the plans without offload are
        evaluated once per placement, not once per CPU count."""
        vkey, known = self._key(kind), self._best
        every = range(1, self.max_cpus_per_gpu + 1) if kind.offload else None
        shared = every is not None and getattr(self.oracle, "cpus_offload_only", False)
        todo, items = [], []
        queued = set()
        plans_of: dict = {}
        """placement -> [its plans, [(index, plan)] of those asked once (without offload, where shared), [(index,
        plan)] of those asked at each CPU count (all of them, where not shared), where the ones asked once start in
        `items` or -1 (not asked yet)]"""
        for place, cpg in wanted:
            place, cpg = canonical(place), self._cpg(kind, cpg)
            if (vkey, place, cpg) in known:
                continue
            held = plans_of.get(place)
            if held is None:
                plans = kind.plans(place) if place else ()
                held = plans_of[place] = [
                    plans, [(i, p) for i, p in enumerate(plans) if not p.offload] if shared else [],
                    [(i, p) for i, p in enumerate(plans) if p.offload] if shared else list(enumerate(plans)), -1]
            if not held[0]:  # no plan: nothing to ask, and none at any CPU count either
                for c in every if every is not None else (cpg,):
                    known[(vkey, place, c)] = NONE
                continue
            for c in every if every is not None else (cpg,):
                if (vkey, place, c) in known or (place, c) in queued:
                    continue
                if held[3] < 0 and held[1]:
                    held[3] = len(items)  # what they take does not depend on the CPUs: asked once
                    items.extend([(place, c, p) for _, p in held[1]])
                todo.append((place, c, len(items)))
                items.extend([(place, c, p) for _, p in held[2]])
                queued.add((place, c))
        if not todo:
            return
        times, resolved = self.oracle.evaluate_many(kind.model, kind.global_batch, items)
        self.evaluations += len(items)
        usable = np.where(np.isfinite(times) & (times > 0), times, np.inf).tolist()
        gbs = kind.global_batch
        once_best: dict = {}
        for place, cpg, lo in todo:
            _, once, each, at = plans_of[place]
            top = once_best.get(place)
            if top is None:  # (time, position among the plans, index in `items`) of the first of the fastest
                top = once_best[place] = _first_fastest(usable, at, once)
            own = _first_fastest(usable, lo, each)
            if own[0] < top[0] or (own[0] == top[0] and own[1] < top[1]):
                top = own
            known[(vkey, place, cpg)] = NONE if top[0] == np.inf else Best(gbs / top[0], resolved[top[2]], place)

    def best_within(self, kind: JobKind, placement: Sequence[int], cpus_per_gpu: int) -> Best:
        """The best plan on `placement` or on a placement left by trimming its smallest nodes."""
        cpus_per_gpu = self._cpg(kind, cpus_per_gpu)
        key = (self._key(kind), canonical(placement), cpus_per_gpu)
        hit = self._within.get(key)
        if hit is None:
            hit = self._within[key] = self._best_within(kind, placement, cpus_per_gpu)
        return hit

    def _best_within(self, kind: JobKind, placement: Sequence[int], cpus_per_gpu: int) -> Best:
        top = NONE
        # canonical, as the keys are; `cpus_per_gpu` is `_cpg`'s already. A trim without plans is NONE, which never
        # beats `top`: left out, it is never filled either
        options = kind.planned_trims(canonical(placement))
        vkey, known = self._key(kind), self._best
        keys = [(vkey, place, cpus_per_gpu) for place in options]
        missing = [(p, cpus_per_gpu) for p, k in zip(options, keys) if k not in known]
        if missing:  # most trims are known: only the new ones go to the fill (which would pass over the others)
            self.fill(kind, missing)
        for k in keys:
            b = known[k]
            if b.throughput > top.throughput * (1 + 1e-9):
                top = b
        return top

    def gpu_curve(self, kind: JobKind, cpus_per_gpu: int) -> np.ndarray:
        """Throughput (samples/s) of the best plan at 0..max_gpus GPUs, as a running maximum."""
        key = (self._key(kind), cpus_per_gpu)
        curve = self._gpu_curves.get(key)
        if curve is None:
            raw = np.zeros(self.max_gpus + 1)
            places = [packed(g, self.node_gpus) for g in range(1, self.max_gpus + 1)]
            self.fill(kind, [(p, cpus_per_gpu) for p in places])
            for g, place in enumerate(places, start=1):
                raw[g] = self.best(kind, place, cpus_per_gpu).throughput
            curve = np.maximum.accumulate(raw)
            curve.setflags(write=False)
            self._gpu_curves[key] = curve
        return curve

    def ceiling(self, kind: JobKind, gpus: int, node_gpus: int) -> float | None:
        """Samples/s that no plan of the kind beats on any placement of up to `gpus` GPUs over nodes of up to
        `node_gpus` each, at any count of CPUs per GPU the book considers; None where the oracle gives no floor
        under its times (`ModelOracle.time_floor`: a table of measured times gives none), `gpus` is past
        `max_gpus` or no node has a GPU. Worked out once per kind and model version, as far as it was asked for: a
        GPU count's plans are those of every shape a placement of it can have (its GPUs split in equal nodes of any
        size up to `node_gpus`: a placement's plans depend only on its GPUs and the greatest common divisor of its
        nodes' counts, `plans.shape`), each at the most CPUs per GPU (only ZeRO-Offload's step reads them, and it is
        the faster for more)."""
        floor_of = getattr(self.oracle, "time_floor", None)
        if floor_of is None or gpus > self.max_gpus or gpus < 1 or node_gpus < 1:
            return None
        key = (self._key(kind), "ceiling", node_gpus)
        tops = self._derived.get(key, _MISSING)
        if tops is None:  # the oracle gave no floor for this version of the model
            return None
        if tops is _MISSING:
            tops = self._derived[key] = [0.0]
        if len(tops) > gpus:
            return tops[gpus]
        cpg = self._cpg(kind, self.max_cpus_per_gpu)
        items, first = [], len(tops)
        for g in range(first, gpus + 1):
            seen: dict = {}
            for s in divisors(g):
                if s <= node_gpus:
                    for plan in kind.plans((s,) * (g // s)):
                        seen.setdefault(plan, None)
            items.extend((g, cpg, plan) for plan in seen)
        floor = floor_of(kind.model, kind.global_batch, items, node_gpus)
        if floor is None:
            self._derived[key] = None
            return None
        best = dict.fromkeys(range(first, gpus + 1), 0.0)
        for (g, _, _), t in zip(items, floor.tolist()):
            if t > 0 and math.isfinite(t) and kind.global_batch / t > best[g]:
                best[g] = kind.global_batch / t
        for g in range(first, gpus + 1):
            tops.append(max(tops[-1], best[g]))
        return tops[gpus]

    def cpu_curve(self, kind: JobKind, placement: Sequence[int]) -> np.ndarray:
        """Throughput at 0..max_cpus_per_gpu CPU threads per GPU on `placement` (running maximum)."""
        place = canonical(placement)
        key = (self._key(kind), place)
        curve = self._cpu_curves.get(key)
        if curve is None:
            raw = np.zeros(self.max_cpus_per_gpu + 1)
            if kind.offload:
                self.fill(kind, [(place, c) for c in range(1, self.max_cpus_per_gpu + 1)])
                for c in range(1, self.max_cpus_per_gpu + 1):
                    raw[c] = self.best(kind, place, c).throughput
            else:  # only ZeRO-Offload runs anything on the CPUs: the curve is flat
                raw[1:] = self.best(kind, place, 1).throughput
            curve = np.maximum.accumulate(raw)
            curve.setflags(write=False)
            self._cpu_curves[key] = curve
        return curve


def _first_fastest(usable: list[float], start: int, plans: list[tuple[int, Plan]]) -> tuple[float, int, int]:
    """(time, position among a placement's plans, index in the oracle's answer) of the fastest of `plans` (their
    positions, in order, and their times from `start` on), the first of them where several tie; (inf, -1, -1) for
    none."""
    if not plans:
        return (np.inf, -1, -1)
    seg = usable[start:start + len(plans)]
    fastest = min(seg)
    k = seg.index(fastest)
    return (fastest, plans[k][0], start + k)


def slope_up(curve: np.ndarray, at: int, upto: int) -> float:
    """Best gain per unit from `at` to any amount up to `upto` (0 when nothing more helps)."""
    if at >= upto or at >= len(curve) - 1:
        return 0.0
    hi = min(upto, len(curve) - 1)
    gains = (curve[at + 1:hi + 1] - curve[at]) / np.arange(1, hi - at + 1)
    return float(max(gains.max(), 0.0))


def slope_down(curve: np.ndarray, at: int, floor: int = 0) -> float:
    """Least loss per unit from `at` down to any amount not below `floor` (the mirror of
    `slope_up`: a job that loses little until its next valid size has a low slope)."""
    at = min(at, len(curve) - 1)
    if at <= floor or at <= 0:
        return 0.0
    lo = max(floor, 0)
    losses = (curve[at] - curve[lo:at][::-1]) / np.arange(1, at - lo + 1)
    return float(max(losses.min(), 0.0))


def up_table(curve: np.ndarray, upto: int) -> np.ndarray:
    """`slope_up(curve, g, upto)` for every g, in one pass: row g of a matrix holds the gain per unit from g to
    every j above it up to `upto` (each the same quotient `slope_up` works out), the rest of the row -inf."""
    n = len(curve)
    out = np.zeros(n)
    hi = min(upto, n - 1)
    if hi >= 1:  # `slope_up` is 0 from g = hi on (g at `upto`, or at the curve's end)
        span = np.arange(hi + 1)
        steps = span[None, :] - span[:hi, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            gains = (curve[None, :hi + 1] - curve[:hi, None]) / steps
        gains[steps <= 0] = -np.inf
        out[:hi] = np.maximum(gains.max(axis=1), 0.0)
    return out


def down_table(curve: np.ndarray, floor: int) -> np.ndarray:
    """`slope_down(curve, g, floor)` for every g, in one pass: row g of a matrix holds the loss per unit from g down
    to every j from `floor` (at least 0) up to g, the rest of the row +inf."""
    n = len(curve)
    out = np.zeros(n)
    lo = max(floor, 0)
    if lo + 1 < n:  # `slope_down` is 0 up to g = lo (at or under the floor, or at 0)
        rows, cols = np.arange(lo + 1, n), np.arange(lo, n - 1)
        steps = rows[:, None] - cols[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            losses = (curve[lo + 1:, None] - curve[None, lo:n - 1]) / steps
        losses[steps <= 0] = np.inf
        out[lo + 1:] = np.maximum(losses.min(axis=1), 0.0)
    return out


def knee(curve: np.ndarray, upto: int | None = None) -> int:
    """The fewest units reaching the curve's maximum (within `upto`)."""
    hi = len(curve) - 1 if upto is None else min(upto, len(curve) - 1)
    top = curve[hi]
    if top <= 0:
        return 0
    return int(np.argmax(curve[:hi + 1] >= top * (1 - 1e-9)))
