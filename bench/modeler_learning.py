"""How fast the modeler's online refit makes the performance model good (issue: "a modeler that learns").

Simulates the Base trace (rubick, 8x8, the fitted model as the policy's oracle) with the real cores; the
simulated agents report the measured table's iteration times (optionally with log-normal noise), and the
modeler refits from them online (`model.updated`). Then every published parameter set, starting with the
one fitted on `fit_points.csv`, is scored against the whole measured table (`throughput_table.csv`, every
row with a time): per (model, plan) cell the average and maximum relative error, as `rubick model validate`
does. Printed: the error curve against the measured iterations the modeler had seen (mean of the cells'
average errors, the worst cell's maximum, cells within the target of average <= 5% and maximum <= 10%),
how many refits it took to reach the target (if it did), and what the refits cost.

    .venv/bin/python bench/modeler_learning.py
    .venv/bin/python bench/modeler_learning.py --noise 0.05 --trace data/rubick-artifact/workload-mt.csv
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import modeler.service as modeler_service  # noqa: E402
from modeler.fit import fit, load_solver  # noqa: E402
from modeler.perf_model import PerfParams  # noqa: E402
from modeler.table import DEFAULT_TABLE  # noqa: E402
from modeler.validate import predict_cells, read_table  # noqa: E402
from replay.config import RunConfig, fit_points_digest, load_parts  # noqa: E402
from replay.importers import read_trace  # noqa: E402
from replay.run import simulate, trace_inputs  # noqa: E402

AVG_TARGET, MAX_TARGET = 5.0, 10.0


def score(parts, params: dict[str, PerfParams], rows_by_model) -> list:
    cells = []
    for name, rows in rows_by_model.items():
        if name in params and name in parts.models:
            cells.extend(predict_cells(parts.models[name], parts.env, params[name], rows))
    return cells


def summary(cells) -> tuple[float, float, int]:
    ok = sum(1 for c in cells if c.avg_pct <= AVG_TARGET and c.max_pct <= MAX_TARGET)
    return float(np.mean([c.avg_pct for c in cells])), float(max(c.max_pct for c in cells)), ok


def refit_cost(inputs, repeats: int = 3) -> None:
    """Each online refit (warm-started from the current parameters, one start) timed again beside a fresh
    fit of the same points (no start given, every start): medians of `repeats` runs each."""
    if not inputs:
        print("\nno online refit ran")
        return
    warm, fresh = [], []
    for model, env, pts, kw in inputs:
        w, f = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            fit(model, env, pts, **kw)
            w.append(time.perf_counter() - t)
            t = time.perf_counter()
            fit(model, env, pts, **{k: v for k, v in kw.items() if k not in ("initial", "multi_start")})
            f.append(time.perf_counter() - t)
        warm.append(float(np.median(w)))
        fresh.append(float(np.median(f)))
    ratio = np.asarray(warm) / np.asarray(fresh)
    sizes = sorted(len(p.batch) for _, _, p, _ in inputs)
    print(f"\nrefit cost: {len(inputs)} online refits (published or not) of {sizes[0]}-{sizes[-1]} points; "
          f"warm-started {np.median(warm) * 1e3:.1f} ms, fresh fit of the same points "
          f"{np.median(fresh) * 1e3:.1f} ms (medians); warm / fresh {np.median(ratio):.2f} "
          f"(range {ratio.min():.2f}-{ratio.max():.2f}); all refits together {sum(warm) * 1e3:.0f} ms warm, "
          f"{sum(fresh) * 1e3:.0f} ms fresh")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=ROOT / "data" / "rubick-artifact" / "workload-base.csv")
    ap.add_argument("--cluster", default="8x8")
    ap.add_argument("--noise", type=float, default=0.0, help="log-normal sigma of the reported times (default 0)")
    ap.add_argument("--sample-every", type=float, default=600.0, help="seconds between a job's samples")
    ap.add_argument("--anchors", action=argparse.BooleanOptionalAction, default=True,
                    help="refits keep the agreed fitting points beside the measured ones (default; "
                         "--no-anchors: the measured points alone, as before)")
    args = ap.parse_args()

    parts = load_parts()
    table = [r for r in read_table(DEFAULT_TABLE) if r.get("iter_time_s") not in (None, "")
             and float(r["iter_time_s"]) > 0]
    rows_by_model: dict[str, list] = {}
    for r in table:
        rows_by_model.setdefault(r["model"], []).append(r)
    cfg = RunConfig(policy="rubick", cluster=args.cluster, noise=args.noise, sample_every_s=args.sample_every,
                    anchors=fit_points_digest() if args.anchors else "")
    jobs = read_trace(args.trace, parts.batches).jobs
    load_solver()
    refit_inputs = []
    real_fit = modeler_service.fit

    def recorded_fit(model, env, pts, **kw):  # every online refit's points, to time it again below
        result = real_fit(model, env, pts, **kw)
        if kw.get("initial") is not None and kw.get("weights") is None:  # a refit, not one of its error bound's
            refit_inputs.append((model, env, pts, kw))
        return result

    modeler_service.fit = recorded_fit
    try:
        t0 = time.perf_counter()
        out = simulate(cfg, trace_inputs(cfg, jobs, parts), parts)
        wall = time.perf_counter() - t0
    finally:
        modeler_service.fit = real_fit
    params = parts.perf_params()
    seen = 0
    curve = []
    cells = score(parts, params, rows_by_model)
    curve.append((0, seen, "start (fit_points.csv)", *summary(cells)))
    refits = 0
    for e in out.result.events:
        if e.base == "metrics.iteration":
            seen += 1
        elif e.base == "model.updated":
            refits += 1
            params[e.payload.model_type] = PerfParams.from_dict(dict(e.payload.params))
            cells = score(parts, params, rows_by_model)
            curve.append((refits, seen, f"{e.payload.model_type} v{e.payload.version} ({e.payload.n_points} points)",
                          *summary(cells)))
    n_cells = len(cells)
    print(f"{args.trace.name} on {args.cluster}: {len(jobs)} jobs, simulated in {wall:.1f} s "
          f"(modeler {out.result.core_seconds.get('modeler', 0):.2f} s), {seen} measured iterations reported, "
          f"{refits} refits published; scored on {len(table)} measured rows in {n_cells} (model, plan) cells\n")
    print(f"{'refit':>5} {'samples seen':>12}  {'mean avg %':>10} {'worst max %':>11} {'cells ok':>8}  after")
    for k, n, what, mean_avg, worst, ok in curve:
        print(f"{k:>5} {n:>12}  {mean_avg:10.2f} {worst:11.2f} {ok:>5}/{n_cells:<2}  {what}")
    reached = next((k for k, _, _, _, _, ok in curve if ok == n_cells), None)
    best = min(curve, key=lambda c: c[3])
    refit_cost(refit_inputs)
    print(f"\ncell target (avg <= {AVG_TARGET:g}%, max <= {MAX_TARGET:g}%) for every cell: "
          + (f"reached after {reached} refits" if reached is not None else "not reached")
          + f"; lowest mean of cell averages {best[3]:.2f}% after refit {best[0]}; "
            f"start {curve[0][3]:.2f}% -> end {curve[-1][3]:.2f}%")


if __name__ == "__main__":
    main()
