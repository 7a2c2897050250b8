"""Flows, EchelonFlows and tardiness (echelonflow-proofs.txt, Definitions 1-3).

An EchelonFlow H is a set of flows f_0..f_{|H|-1} (in the order they start) with an arrangement
function giving each flow's ideal finish time d_j from the reference time r, the start of the head
flow (d_0 = r = s_0). A flow's tardiness is e_j - d_j (e_j: its actual finish); the EchelonFlow's is
the largest of its flows' (Eq. S2); the objective is the (weighted) sum over EchelonFlows (Eq. S4).

Arrangements (offsets d_j - r):
- Coflow (DP all-reduce, Eq. S5): all 0;
- pipeline (Eq. S8/S9): j * T, T the receiving stage's compute time of one micro-batch;
- FSDP / ZeRO-3 all-gathers (Eq. S12): n forward ones spaced by T_fwd, then n backward ones spaced
  by T_bwd (the first backward one T_bwd after the last forward one).
Pure code: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .topology import NetworkError


@dataclass(frozen=True)
class Flow:
    src: str
    dst: str
    size: float
    """bytes"""
    offset: float = 0.0
    """ideal finish time - the EchelonFlow's reference time, seconds (>= 0)"""

    def check(self, where: str = "flow") -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, (int, float)) or not math.isfinite(self.size) \
                or self.size <= 0:
            raise NetworkError(f"{where} {self.src}->{self.dst}: size must be a finite number of bytes > 0, "
                               f"got {self.size!r}")
        if not isinstance(self.offset, (int, float)) or not math.isfinite(self.offset) or self.offset < 0:
            raise NetworkError(f"{where} {self.src}->{self.dst}: offset must be a finite number of seconds >= 0, "
                               f"got {self.offset!r}")
        if self.src == self.dst:
            raise NetworkError(f"{where}: a flow from {self.src} to itself is not a network flow")


@dataclass(frozen=True)
class EchelonFlow:
    id: str
    flows: tuple[Flow, ...]
    job: str = ""
    weight: float = 1.0
    kind: str = "coflow"
    """what made it: coflow (all-reduce / all-gather / reduce-scatter of one bucket), pipeline, fsdp"""

    def check(self) -> None:
        if not self.flows:
            raise NetworkError(f"EchelonFlow {self.id}: no flows")
        if not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight) or self.weight <= 0:
            raise NetworkError(f"EchelonFlow {self.id}: weight must be a finite number > 0, got {self.weight!r}")
        for i, f in enumerate(self.flows):
            f.check(f"EchelonFlow {self.id} flow {i}")

    def as_coflow(self) -> "EchelonFlow":
        """The same flows with one ideal finish time (how a Coflow scheduler sees them)."""
        return EchelonFlow(self.id, tuple(Flow(f.src, f.dst, f.size, 0.0) for f in self.flows), self.job,
                           self.weight, "coflow")


def coflow_offsets(n: int) -> list[float]:
    """Eq. S5: every flow's ideal finish time is the reference time."""
    return [0.0] * n


def pipeline_offsets(n: int, stage_s: float) -> list[float]:
    """Eq. S8: d_j = d_{j-1} + T (T: the receiving stage's compute time of one micro-batch)."""
    return [j * float(stage_s) for j in range(n)]


def fsdp_offsets(n_layers: int, fwd_s: float, bwd_s: float) -> list[float]:
    """Eq. S12, for the 2n all-gathers of an n-layer (n-unit) model: forward ones spaced by T_fwd,
    backward ones by T_bwd."""
    out = [0.0]
    for i in range(1, 2 * n_layers):
        out.append(out[-1] + (fwd_s if i <= n_layers - 1 else bwd_s))
    return out


def tardiness(finish: Sequence[float], ideal: Sequence[float]) -> float:
    """Eq. S2: the largest e_j - d_j."""
    if len(finish) != len(ideal) or not finish:
        raise ValueError("tardiness needs one finish time per ideal finish time")
    return max(e - d for e, d in zip(finish, ideal))
