"""Per-flow rates at one instant: the network scheduler's decision (pure code, no I/O).

The active flows are arrays (one entry per flow): the links each crosses (`paths`, padded with the
index `len(capacity)`, a link of unlimited capacity), the bytes left, the absolute ideal finish time
(`deadline`), the EchelonFlow it belongs to (`group`) and, for `classes`, its traffic class.

Modes (all work-conserving: when they return, every flow with bytes left crosses at least one
saturated link, so no flow could go faster without another going slower):

- `fair`: max-min fair sharing of every link among the flows crossing it (progressive filling), what
  a fabric of fair-sharing transports converges to;
- `coflow`: Varys' SEBF + MADD. EchelonFlows are treated as Coflows (one ideal finish time), ranked by
  their bottleneck time Gamma = max over links of (bytes left on the link / its capacity), smallest
  first; each in turn gets, from what the ones before it left, the rates that make all its flows
  finish together at its smallest possible time (MADD); what is left is shared max-min (back-fill);
- `echelonflow`: the EchelonFlow adaptation (echelonflow-proofs.txt, Property 4).
  Ranking. EchelonFlows are ranked as SEBF ranks Coflows, by their bottleneck time Gamma (the bytes still
  to send on their busiest link over its capacity), smallest first, divided by the EchelonFlow's weight:
  the ranking that had the lowest total tardiness of those measured (docs/network.md), ahead of ranking by
  the tardiness each would reach alone. On Coflows the orders of `coflow` and `echelonflow` agree; what
  differs is how each EchelonFlow is served.
  Rates. Each in turn, from what the ones before it left, aims at T = max(T*, I_H, 0), I_H the tardiness
  its finished flows already locked in (Eq. S2 takes the maximum, so flows finishing within it cost
  nothing), T* the least
  tardiness of serving its flows earliest ideal finish first (Jackson's rule, optimal for the largest
  lateness on one link): on every link, max_k (sum_{j <= k} b_j / c_l - (d_k - now)). It reserves on
  each link the least constant rate that lands every flow by d_j + T in that order,
  R_l = max_k sum_{j <= k} b_j / (d_k + T - now), and its flows take it earliest ideal finish first
  (flows of one ideal time together at rates that finish them together: MADD). So it never goes
  faster than its ideal times, or the tardiness it already has, need: a flow with slack lands just in
  time and leaves the rest of the link to others. What is left is shared max-min (back-fill);
- `classes`: strict priority between traffic classes (0 first), max-min fair inside a class: what a
  fabric with per-class priority queues does with the classes `network.decided` gives the jobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

MODES = ("fair", "coflow", "echelonflow", "classes")
EPS = 1e-9
"""A link with at most this fraction of its capacity left counts as saturated."""


@dataclass
class Active:
    """The flows active at one instant (see the module docstring)."""

    capacity: np.ndarray      # (L,) bytes/s
    paths: np.ndarray         # (F, K) link indices, padded with L
    remaining: np.ndarray     # (F,) bytes
    deadline: np.ndarray      # (F,) seconds, absolute
    group: np.ndarray         # (F,) EchelonFlow index
    weight: np.ndarray | None = None  # (G,) per EchelonFlow, default 1
    klass: np.ndarray | None = None   # (F,) traffic class, for `classes`
    incurred: np.ndarray | None = None  # (G,) per EchelonFlow, the largest tardiness of its finished flows

    def __len__(self) -> int:
        return len(self.remaining)


def allocate(mode: str, active: Active, now: float) -> np.ndarray:
    """Rates (bytes/s) for every active flow."""
    if mode not in MODES:
        raise ValueError(f"unknown network mode {mode!r}; expected one of {', '.join(MODES)}")
    n = len(active)
    if n == 0:
        return np.zeros(0)
    residual = np.append(np.asarray(active.capacity, dtype=np.float64), math.inf)
    rates = np.zeros(n)
    if n <= SMALL:
        return _allocate_small(mode, active, now, residual, rates)
    if mode == "fair":
        return maxmin(residual, active.paths, np.ones(n, dtype=bool), rates, active.capacity)
    if mode == "classes":
        klass = np.zeros(n, dtype=np.int64) if active.klass is None else np.asarray(active.klass)
        for c in np.unique(klass):
            maxmin(residual, active.paths, klass == c, rates, active.capacity)
        return _backfill(residual, active, rates)
    _priority(active, now, mode == "coflow", residual, rates)
    return _backfill(residual, active, rates)


def _priority(active: Active, now: float, coflow: bool, residual: np.ndarray, rates: np.ndarray) -> None:
    """`coflow` and `echelonflow`: rank the EchelonFlows, then give each in turn its rates from what the ones
    before it left (module docstring). Plain Python over small per-group lists: a group crosses few links."""
    L = len(residual) - 1
    rem = active.remaining.tolist()
    grp = active.group.tolist()
    rows = active.paths.tolist()
    members: dict[int, list[int]] = {}
    for f, g in enumerate(grp):
        members.setdefault(g, []).append(f)
    dl = active.deadline.tolist()
    if coflow:  # one ideal finish time per group: its earliest
        first = {g: min(dl[f] for f in fs) for g, fs in members.items()}
        x = [first[g] - now for g in grp]
    else:
        x = [d - now for d in dl]
    links: dict[int, dict[int, list[int]]] = {}
    for g, fs in members.items():
        per = links[g] = {}
        for f in sorted(fs, key=lambda f: (x[f], f)):  # each link's flows in ideal-finish order
            for link in rows[f]:
                if link != L:
                    per.setdefault(link, []).append(f)
    cap = residual[:L].tolist()
    incurred = None if coflow or active.incurred is None else active.incurred.tolist()
    weight = None if active.weight is None else active.weight.tolist()
    keys = []
    for g in sorted(members):
        # the bottleneck time Gamma: the time its bytes still need on its busiest link (SEBF's key, in both modes)
        t = 0.0
        for link, fs in links[g].items():
            t = max(t, sum(rem[f] for f in fs) / cap[link] if cap[link] > 0 else math.inf)
        w = 1.0 if weight is None else weight[g]
        keys.append((t / w, g))
    keys.sort()
    for _, g in keys:
        per = links[g]
        t = -math.inf
        for link, fs in per.items():
            t = max(t, _edf_bound(fs, rem, x, cap[link]))
        if not math.isfinite(t):
            continue  # a link it needs is full: it waits for the back-fill
        if not coflow:
            t = max(t, 0.0, 0.0 if incurred is None else incurred[g])
        for f, v in _reserve(per, rem, x, t, cap).items():
            rates[f] += v
    residual[:L] = cap


def _edf_bound(fs: list[int], rem: list[float], x: list[float], cap: float) -> float:
    """The smallest common tardiness T of flows `fs` (in ideal-finish order) sharing one link of `cap`
    bytes/s: serving them earliest ideal finish first, flow k finishes after the bytes of those up to it,
    so T = max_k (sum_{j <= k} b_j / cap - (d_k - now)) (Jackson's rule; flows of one ideal time at once)."""
    if cap <= 0:
        return math.inf
    t, total = -math.inf, 0.0
    for i, f in enumerate(fs):
        total += rem[f]
        if i + 1 == len(fs) or x[fs[i + 1]] != x[f]:
            t = max(t, total / cap - x[f])
    return t


def _reserve(per: dict[int, list[int]], rem: list[float], x: list[float], t: float,
             cap: list[float]) -> dict[int, float]:
    """Rates for one EchelonFlow aiming at tardiness `t`: on each link the least constant rate that lands every
    flow by d_j + t when they are served in ideal-finish order, R_l = max_k sum_{j <= k} b_j / (d_k + t - now);
    then the flows, earliest ideal finish first, take it (flows of one ideal time together, at rates that
    finish them together: MADD). Takes the rates from `cap`."""
    reserve: dict[int, float] = {}
    for link, fs in per.items():
        total, need = 0.0, 0.0
        for i, f in enumerate(fs):
            total += rem[f]
            if i + 1 == len(fs) or x[fs[i + 1]] != x[f]:
                need = max(need, total / max(x[f] + t, 1e-300))
        reserve[link] = min(need, cap[link])
    blocks: dict[float, list[int]] = {}
    flows_links: dict[int, list[int]] = {}
    for link, fs in per.items():
        for f in fs:
            if f not in flows_links:
                blocks.setdefault(x[f], []).append(f)
            flows_links.setdefault(f, []).append(link)
    out: dict[int, float] = {}
    for d in sorted(blocks):
        block = blocks[d]
        on: dict[int, float] = {}
        for f in block:
            for link in flows_links[f]:
                on[link] = on.get(link, 0.0) + rem[f]
        # the block's common finish time tau with what is left of the reservation
        tau = max((b / reserve[link] if reserve[link] > 0 else math.inf) for link, b in on.items())
        if not math.isfinite(tau) or tau <= 0:
            continue
        for f in block:
            out[f] = rem[f] / tau
        for link, b in on.items():
            reserve[link] = max(0.0, reserve[link] - b / tau)
    for link, fs in per.items():
        cap[link] = max(0.0, cap[link] - sum(out.get(f, 0.0) for f in fs))
    return out


def _solve(bs: list[float], xs: list[float], cap: float) -> float:
    """Least T > -min(x) with g(T) = sum b / (x + T) <= cap. Newton's method on 1/g(T) - 1/cap, which is
    increasing and concave in T (1/g is the parallel sum of the affine x + T over b), so from the largest
    single-flow bound it climbs to the root without passing it; 1/g is nearly straight, so it takes few
    steps (exactly one when all x are equal)."""
    if cap <= 0:
        return math.inf
    if len(bs) == 1 or min(xs) == max(xs):
        return sum(bs) / cap - xs[0]
    t = max(b / cap - x for b, x in zip(bs, xs))
    low = -min(xs)
    if t <= low:  # rounding put the start on the pole (a flow of almost no bytes long overdue)
        t = math.nextafter(low, math.inf)
        while t <= low or any(x + t <= 0 for x in xs):
            t = math.nextafter(t, math.inf)
    for _ in range(100):
        g = dg = 0.0
        for b, x in zip(bs, xs):
            u = x + t
            g += b / u
            dg += b / (u * u)
        if g <= cap * (1.0 + 1e-12):
            break
        step = g * (g - cap) / (cap * dg)
        if step <= abs(t) * 1e-15:
            break
        t += step
    return t


def maxmin(residual: np.ndarray, paths: np.ndarray, mask: np.ndarray, rates: np.ndarray,
           capacity: np.ndarray | None = None) -> np.ndarray:
    """Progressive filling: the flows in `mask` all grow at the same pace; a flow stops growing when a
    link it crosses saturates (has at most `EPS` of its `capacity` left). Adds to `rates` and takes
    from `residual` (both in place)."""
    L = len(residual) - 1
    cap0 = residual[:L].copy() if capacity is None else np.asarray(capacity, dtype=np.float64)
    growing = mask.copy()
    # a flow crossing a link already full cannot grow at all
    full = np.append(residual[:L] <= EPS * cap0, False)
    growing &= ~full[paths].any(axis=1)
    while growing.any():
        sub = paths[growing]
        count = np.bincount(sub.ravel(), minlength=L + 1)[:L]
        used = count > 0
        share = np.full(L, math.inf)
        share[used] = residual[:L][used] / count[used]
        inc = float(share.min())
        if not math.isfinite(inc):
            break  # the growing flows cross no link of finite capacity (cannot happen for real paths)
        rates[growing] += inc
        residual[:L] -= count * inc
        sat = used & (residual[:L] <= EPS * cap0)
        sat[np.argmin(share)] = True  # the bottleneck is full whatever rounding says
        residual[:L][sat] = 0.0
        full = np.append(sat, False)
        growing &= ~full[paths].any(axis=1)
    np.maximum(residual, 0.0, out=residual)
    return rates


SMALL = 64
"""Up to this many flows, max-min runs on Python lists (numpy's per-call cost dominates small sets)."""


def _allocate_small(mode: str, active: Active, now: float, residual: np.ndarray, rates: np.ndarray) -> np.ndarray:
    L = len(residual) - 1
    rows = [tuple(link for link in row if link != L) for row in active.paths.tolist()]
    cap0 = np.asarray(active.capacity, dtype=np.float64).tolist()
    n = len(rows)
    if mode in ("coflow", "echelonflow"):
        _priority(active, now, mode == "coflow", residual, rates)
    res, out = residual[:L].tolist(), rates.tolist()
    if mode == "classes":
        klass = [0] * n if active.klass is None else np.asarray(active.klass).tolist()
        for c in sorted(set(klass)):
            _maxmin_small(res, rows, [i for i in range(n) if klass[i] == c], out, cap0)
    _maxmin_small(res, rows, range(n), out, cap0)  # fair sharing, or the back-fill
    return np.asarray(out)


def _maxmin_small(res: list[float], rows: list[tuple[int, ...]], members, rates: list[float],
                  cap0: list[float]) -> None:
    """`maxmin` on Python lists (the same steps, the same ties)."""
    growing = [i for i in members if all(res[link] > EPS * cap0[link] for link in rows[i])]
    while growing:
        count: dict[int, int] = {}
        for i in growing:
            for link in rows[i]:
                count[link] = count.get(link, 0) + 1
        inc, bottleneck = min((res[link] / c, link) for link, c in count.items())
        for i in growing:
            rates[i] += inc
        full = set()
        for link, c in count.items():
            res[link] -= c * inc
            if res[link] <= EPS * cap0[link] or link == bottleneck:
                res[link] = 0.0
                full.add(link)
        growing = [i for i in growing if not any(link in full for link in rows[i])]
    for link, v in enumerate(res):
        if v < 0:
            res[link] = 0.0


def _backfill(residual: np.ndarray, active: Active, rates: np.ndarray) -> np.ndarray:
    """Work conservation: share what is left max-min among every flow that can still grow."""
    return maxmin(residual, active.paths, np.ones(len(rates), dtype=bool), rates, active.capacity)


def smallest_tardiness(links: Sequence[Sequence[int]], sizes: Sequence[float], offsets: Sequence[float],
                       capacity: Sequence[float], *, coflow: bool = False) -> float:
    """The smallest tardiness one EchelonFlow (all its flows released at its reference time 0) can reach alone
    on links of `capacity`: flow j crosses `links[j]`, has `sizes[j]` bytes and ideal finish time `offsets[j]`;
    `coflow`: with one ideal finish time for all (its bottleneck time Gamma)."""
    per: dict[int, list[int]] = {}
    for j, row in enumerate(links):
        for link in row:
            per.setdefault(link, []).append(j)
    x = [0.0] * len(sizes) if coflow else [float(o) for o in offsets]
    t = -math.inf
    for link, js in per.items():
        t = max(t, _solve([float(sizes[j]) for j in js], [x[j] for j in js], float(capacity[link])))
    return t if per else 0.0
