"""Measured iteration times: the artifact's `throughput_table.csv` as a lookup.

The table is the trace simulator's ground truth and can stand in for the performance model (the
policy's checks against the paper use it). A row is one (model, plan family, placement) with its
measured seconds per iteration; see `data/rubick-artifact/README.md` for the columns.

How a `Plan` maps onto the table's plan codes:

- TP > 1 or PP > 1: the three-digit Megatron code `PTD` (PP, TP, DP), ZeRO stage 0; a plan with
  only TP (PP = DP = 1) also matches the `tp+ga` rows;
- DP only: `ga` (stage 0, no GC), `gc` (stage 0 with GC), `zero-dp` (stage 2), `zero-offload`
  (stage 2 + offload), `zero-offload+gc`; plain DP also matches a `11D` code. ZeRO stages 1 and 3
  were never measured.
- GA steps are not recorded in the table (GA is used only where the per-GPU batch does not fit),
  so they do not take part in the lookup. GC is unknown for some `zero-offload` rows; those rows
  match either value.
- Placements are looked up by their GPUs per node in ascending order (every placement in the table
  is written that way). CPU threads per GPU are recorded for one model only; there the row with the
  most threads not above the request is used.

`iter_time` answers seconds, `inf` for a measured infeasible configuration (out of memory), or
None where the configuration was never measured.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from controlplane.events import Plan

DEFAULT_TABLE = Path(__file__).resolve().parent.parent / "data" / "rubick-artifact" / "throughput_table.csv"


def placement_key(gpus_per_node: Iterable[int]) -> str:
    """GPUs per node, ascending, joined by ';' (the table's `gpus_per_node` in canonical order)."""
    return ";".join(str(g) for g in sorted(int(g) for g in gpus_per_node if g > 0))


def plan_codes(plan: Plan) -> tuple[str, ...]:
    """The table codes a plan may be found under, best match first."""
    if plan.tp > 1 or plan.pp > 1:
        if plan.zero_stage or plan.offload:
            return ()
        code = f"{plan.pp}{plan.tp}{plan.dp}"
        return (code, "tp+ga") if plan.pp == 1 and plan.dp == 1 else (code,)
    if plan.offload:
        if plan.zero_stage != 2:
            return ()
        return ("zero-offload+gc", "zero-offload") if plan.gc else ("zero-offload",)
    if plan.zero_stage == 2:
        return ("zero-dp",) if not plan.gc else ()
    if plan.zero_stage == 0:
        return ("gc",) if plan.gc else ("ga", f"11{plan.dp}")
    return ()


@dataclass(frozen=True)
class _Row:
    iter_time_s: float
    gc: bool | None
    cpu_threads: int | None


@dataclass
class MeasuredTable:
    """Iteration times per (model, plan code, placement), read from `throughput_table.csv`."""

    rows: dict[tuple[str, str, str], list[_Row]] = field(default_factory=dict)
    global_batch: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_csv(cls, path: str | Path = DEFAULT_TABLE) -> "MeasuredTable":
        with open(path, newline="") as fh:
            return cls.from_records(csv.DictReader(fh))

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, str]]) -> "MeasuredTable":
        table = cls()
        for rec in records:
            model = rec["model"]
            code = rec["exec_plan"]
            key = (model, code, placement_key(int(g) for g in rec["gpus_per_node"].split(";")))
            t = float(rec["iter_time_s"])
            feasible = rec.get("feasible", "1") != "0" and t > 0
            gc = None if rec.get("gc", "") == "" else rec["gc"] == "1"
            threads = int(rec["cpu_threads"]) if rec.get("cpu_threads") else None
            table.rows.setdefault(key, []).append(_Row(t if feasible else math.inf, gc, threads))
            table.global_batch[model] = int(rec["global_batch_size"])
        for rows in table.rows.values():
            rows.sort(key=lambda r: (r.cpu_threads or 0, r.gc is None, r.gc or False))
        return table

    @property
    def models(self) -> list[str]:
        return sorted(self.global_batch)

    def iter_time(self, model: str, plan: Plan, gpus_per_node: Iterable[int],
                  cpus_per_gpu: int | None = None) -> float | None:
        """Measured seconds per iteration; `inf` if measured out of memory; None if never measured."""
        place = placement_key(gpus_per_node)
        for code in plan_codes(plan):
            rows = self.rows.get((model, code, place))
            if not rows:
                continue
            fitting = [r for r in rows if r.gc is None or r.gc == plan.gc or code.endswith("+gc")]
            if not fitting:
                continue
            threaded = [r for r in fitting if r.cpu_threads is not None]
            if not threaded:
                return fitting[0].iter_time_s
            if cpus_per_gpu is None:
                return threaded[-1].iter_time_s
            usable = [r for r in threaded if r.cpu_threads <= cpus_per_gpu]
            return usable[-1].iter_time_s if usable else math.inf
        return None
