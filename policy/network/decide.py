"""Per-job traffic classes: what `network.decided` carries (pure code, no I/O).

A fabric offers a few traffic classes (priority queues), not per-flow rates, and a training process
sends all its flows in one class. So the scheduler's order is decided per job, from the EchelonFlows
of one iteration of each job (`pattern.iteration_pattern`), each taken alone on the network with all
its flows released at its reference time:

- `echelonflow`: a job's key is the sum over its EchelonFlows of the smallest tardiness T_H each can
  reach (`rates.smallest_tardiness`, arrangement offsets kept), divided by its weight;
- `coflow`: the same with every EchelonFlow collapsed to a Coflow (one ideal finish time): the sum of
  their bottleneck times Gamma (Varys' SEBF order);
- `fair`: no order; every job in class 0 (the fabric shares fairly: what it does today).

Jobs are ranked by key, smallest first (ties by job id), and the ranks are cut into `classes` equal
bands: rank r of n jobs gets class r * classes // n (with n <= classes, class = rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .fluid import Pattern
from .rates import smallest_tardiness
from .topology import Network


@dataclass(frozen=True)
class JobClass:
    job: str
    traffic_class: int
    rank: int
    bytes_per_iteration: float
    tardiness_s: float


def job_key(network: Network, pattern: Pattern, coflow: bool) -> float:
    """Sum over the job's EchelonFlows of the smallest tardiness each reaches alone (>= 0)."""
    by_echelon: dict[int, list] = {}
    for t in pattern.flows:
        by_echelon.setdefault(t.echelon, []).append(t)
    caps = network.capacity.tolist()
    total = 0.0
    for e in sorted(by_echelon):
        flows = by_echelon[e]
        t = smallest_tardiness([network.path(f.src, f.dst) for f in flows], [f.size for f in flows],
                               [f.offset for f in flows], caps, coflow=coflow)
        total += max(t, 0.0)
    return total


def classify(mode: str, network: Network, patterns: Sequence[Pattern], classes: int, *,
             cache: dict | None = None) -> list[JobClass]:
    """Class and rank of every job (in rank order). `cache`: a dict kept by the caller between calls on the
    same network, holding each pattern's bytes and key (patterns are immutable: the same pattern object, the
    same key)."""
    if classes < 1:
        raise ValueError("a fabric offers at least one traffic class")
    rows = []
    for p in patterns:
        hit = None if cache is None else cache.get((mode, id(p)))
        if hit is None or hit[0] is not p:
            hit = (p, float(sum(t.size for t in p.flows)), job_key(network, p, coflow=(mode == "coflow")))
            if cache is not None:
                cache[(mode, id(p))] = hit
        _, sent, key = hit
        rows.append((0.0 if mode == "fair" else key / p.weight, p.job, sent, key))
    rows.sort()
    n = len(rows)
    out = []
    for rank, (_, job, sent, key) in enumerate(rows):
        klass = 0 if mode == "fair" else (rank if n <= classes else rank * classes // n)
        out.append(JobClass(job, klass, rank, sent, key))
    return out
