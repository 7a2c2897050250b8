"""Validation on the artifact's measurements: fit each model on `fit_points.csv` only, predict every
other measured row of `throughput_table.csv`, and report average and maximum relative error per
model and plan beside the paper's Table 2."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import polars as pl

from .configs import ConfigBatch, ConfigError, batch_from_records, measured_times
from .env import Environment
from .fit import FitError, FitResult, Measurements, fit
from .memory import resolve_ga
from .perf_model import PerfParams, t_iter
from .spec import ModelType, load_model
from .uncertainty import Uncertainty, estimate, sigmas

MODEL_KEYS = ("vit", "roberta", "bert", "t5", "gpt2", "llama7", "llama30")
PLAN_ORDER = ("DP", "GC", "ZeRO-DP+GA", "ZeRO-Offload", "TP+PP", "DP+TP+PP")
PAPER_TABLE2: dict[tuple[str, str], tuple[float, float]] = {
    # (model, plan) -> (average %, maximum %), from the paper's Table 2 (LLaMA-30B is not legible there)
    ("vit", "DP"): (3.63, 6.83), ("vit", "GC"): (2.59, 6.19), ("vit", "ZeRO-DP+GA"): (4.23, 6.67),
    ("vit", "ZeRO-Offload"): (3.00, 8.32),
    ("roberta", "DP"): (2.21, 4.37), ("roberta", "GC"): (3.36, 4.29), ("roberta", "ZeRO-DP+GA"): (3.59, 6.71),
    ("roberta", "ZeRO-Offload"): (7.42, 10.44),
    ("bert", "DP"): (5.27, 8.32), ("bert", "GC"): (4.90, 7.27), ("bert", "ZeRO-DP+GA"): (3.70, 6.90),
    ("bert", "ZeRO-Offload"): (6.37, 8.62),
    ("t5", "TP+PP"): (3.18, 8.24), ("t5", "DP+TP+PP"): (2.41, 9.55), ("t5", "ZeRO-DP+GA"): (6.71, 9.55),
    ("t5", "ZeRO-Offload"): (4.37, 6.34),
    ("gpt2", "TP+PP"): (2.39, 3.08), ("gpt2", "DP+TP+PP"): (2.80, 4.15), ("gpt2", "ZeRO-DP+GA"): (2.52, 3.86),
    ("gpt2", "ZeRO-Offload"): (5.52, 8.90),
    ("llama7", "TP+PP"): (1.90, 2.90), ("llama7", "DP+TP+PP"): (4.70, 9.45),
    ("llama7", "ZeRO-Offload"): (4.09, 6.38),
}
KEY_COLUMNS = ("dp", "tp", "pp", "zero_stage", "offload", "gc", "gpus_per_node")


def plan_name(rec: dict[str, Any]) -> str:
    """The Table 2 column a measured row belongs to."""
    fam = rec.get("plan_family") or ""
    if fam in ("ga", "gc", "zero-dp", "zero-offload", "zero-offload+gc"):
        return {"ga": "DP", "gc": "GC", "zero-dp": "ZeRO-DP+GA"}.get(fam, "ZeRO-Offload")
    if int(rec["zero_stage"] or 0) and int(rec["offload"] or 0):
        return "ZeRO-Offload"
    if int(rec["zero_stage"] or 0):
        return "ZeRO-DP+GA"
    if int(rec["tp"]) * int(rec["pp"]) > 1:
        return "DP+TP+PP" if int(rec["dp"]) > 1 else "TP+PP"
    return "GC" if str(rec.get("gc") or "0") == "1" else "DP"


def _key(rec: dict[str, Any]) -> tuple[str, ...]:
    return tuple("0" if rec.get(c) in (None, "") else str(rec[c]).strip() for c in KEY_COLUMNS)


def read_table(path: Path) -> list[dict[str, Any]]:
    return pl.read_csv(path, infer_schema_length=0).to_dicts()


def _ms(records: list[dict[str, Any]], column: str) -> np.ndarray | None:
    if not records or column not in records[0]:
        return None
    out = []
    for rec in records:
        try:
            out.append(float(rec[column]) / 1000.0)
        except (TypeError, ValueError):
            out.append(np.nan)
    return np.asarray(out)


def measurements(model: ModelType, records: list[dict[str, Any]], labels: list[int] | None = None) -> Measurements:
    """Measured points of a fit table (rows already chosen for the model); `labels`: their row numbers
    in the file (1 = the first data row), which errors name."""
    batch = batch_from_records(records, allow_tp_across_nodes=model.allow_tp_across_nodes)
    fwd = _ms(records, "forward_ms")
    bws = _ms(records, "overlap_sync_ms")
    if fwd is not None and bws is not None:  # backward+sync is only the part without forward when forward was recorded
        bws = np.where(fwd > 0, bws, np.nan)
    return Measurements(batch=batch, iter_time_s=measured_times(records), fwd_s=fwd, bwd_sync_s=bws,
                        opt_s=_ms(records, "optimize_ms"), labels=None if labels is None else tuple(labels))


def points_by_model(models: Mapping[str, ModelType], path: Path) -> dict[str, Measurements]:
    """The measured points of a fit table per model type (types without rows, or with a row the table
    cannot give, left out)."""
    rows = read_table(path)
    out = {}
    for key in sorted(models):
        mine = [r for r in rows if r["model"] == key]
        if mine:
            try:
                out[key] = measurements(models[key], mine)
            except (FitError, ConfigError):
                continue
    return out


def duplicate_key(rec: dict[str, Any]) -> tuple[str, ...]:
    """What makes two rows of a fit table the same configuration."""
    return _key(rec) + tuple("" if rec.get(c) in (None, "") else str(rec[c]).strip()
                             for c in ("ga_steps", "micro_batches", "global_batch_size", "cpu_threads"))


@dataclass(frozen=True)
class Cell:
    model: str
    plan: str
    n: int
    avg_pct: float
    max_pct: float
    worst: str
    in_bound: int = -1
    """rows whose measured time lies inside the prediction's 90% error bound (-1: no bound)"""
    bound_pct: float = math.nan
    """the median of the rows' upper error bounds, in percent"""


@dataclass(frozen=True)
class ModelValidation:
    model: str
    fit: FitResult
    cells: tuple[Cell, ...]
    uncertainty: Uncertainty | None = None


def validate_model(model: ModelType, env: Environment, fit_rows: list[dict[str, Any]],
                   table_rows: list[dict[str, Any]]) -> ModelValidation:
    pts = measurements(model, fit_rows)
    result = fit(model, env, pts)
    unc = estimate(model, env, pts, result)
    fitted_keys = {_key(r) for r in fit_rows}
    rows = [r for r in table_rows if _key(r) not in fitted_keys and float(r["iter_time_s"]) > 0]
    return ModelValidation(model=model.name, fit=result, cells=predict_cells(model, env, result.params, rows, unc),
                           uncertainty=unc)


def predict_cells(model: ModelType, env: Environment, params: PerfParams,
                  rows: list[dict[str, Any]], unc: Uncertainty | None = None) -> tuple[Cell, ...]:
    if not rows:
        return ()
    batch: ConfigBatch = resolve_ga(model, env, batch_from_records(rows, allow_tp_across_nodes=model.allow_tp_across_nodes))
    pred = t_iter(model, env, params, batch)
    meas = measured_times(rows)
    err = np.abs(pred - meas) / meas * 100.0
    inside = bound = None
    if unc is not None:
        s = sigmas(model, env, params, unc, batch)
        inside = np.abs(np.log(pred / meas)) <= unc.z * s
        bound = np.expm1(unc.z * s) * 100.0
    plans = np.asarray([plan_name(r) for r in rows])
    cells = []
    for plan in PLAN_ORDER:
        idx = np.flatnonzero(plans == plan)
        if idx.size == 0:
            continue
        w = idx[np.argmax(err[idx])]
        r = rows[w]
        cells.append(Cell(model=model.name, plan=plan, n=int(idx.size), avg_pct=float(err[idx].mean()),
                          max_pct=float(err[idx].max()),
                          worst=f"{r.get('exec_plan', '')}@{r.get('placement', r['gpus_per_node'])} "
                                f"measured {meas[w]:.3f} s, predicted {pred[w]:.3f} s",
                          in_bound=-1 if inside is None else int(inside[idx].sum()),
                          bound_pct=math.nan if bound is None else float(np.median(bound[idx]))))
    return tuple(cells)


def validate(data_dir: Path, models_dir: Path, env: Environment,
             keys: tuple[str, ...] = MODEL_KEYS) -> list[ModelValidation]:
    fit_rows = read_table(data_dir / "fit_points.csv")
    table = read_table(data_dir / "throughput_table.csv")
    out = []
    for key in keys:
        model = load_model(models_dir / f"{key}.yaml")
        out.append(validate_model(model, env, [r for r in fit_rows if r["model"] == key],
                                  [r for r in table if r["model"] == key]))
    return out


def format_report(results: list[ModelValidation], *, avg_target: float = 5.0, max_target: float = 10.0) -> str:
    lines = [f"{'model':<8} {'plan':<13} {'n':>3} {'avg %':>7} {'max %':>7}   {'paper avg':>9} {'paper max':>9}"
             f"  {'bound %':>7} {'inside':>6}  worst row"]
    for res in results:
        for c in res.cells:
            paper = PAPER_TABLE2.get((c.model, c.plan))
            pa = f"{paper[0]:9.2f} {paper[1]:9.2f}" if paper else f"{'-':>9} {'-':>9}"
            flag = "" if c.avg_pct <= avg_target and c.max_pct <= max_target else "  MISS"
            bd = f"{c.bound_pct:7.1f} {c.in_bound:>3}/{c.n:<2}" if c.in_bound >= 0 else f"{'-':>7} {'-':>6}"
            lines.append(f"{c.model:<8} {c.plan:<13} {c.n:>3} {c.avg_pct:7.2f} {c.max_pct:7.2f}   {pa}  {bd}  "
                         f"{c.worst}{flag}")
    cells = [c for res in results for c in res.cells if c.in_bound >= 0]
    if cells:
        inside, n = sum(c.in_bound for c in cells), sum(c.n for c in cells)
        lines.append(f"error bounds (90%, `bound %` the median upper bound): {inside} of {n} rows "
                     f"({inside / n:.0%}) inside their bound")
    lines.append("")
    lines.append("fits (RMSLE on the fitting points):")
    for res in results:
        p = res.fit.params.as_dict()
        lines.append(f"  {res.model:<8} points {res.fit.n_points:>2}  rmsle {res.fit.rmsle:.4f}  "
                     + "  ".join(f"{k}={v:.4g}" for k, v in p.items())
                     + ("" if res.fit.offload_fitted else "  (offload parameters not fitted)")
                     + ("" if res.uncertainty is None else
                        f"  bound {res.uncertainty.margin:.1%} (out-of-fold {res.uncertainty.sigma_cv:.3f})"))
    return "\n".join(lines)
