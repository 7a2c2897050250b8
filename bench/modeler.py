"""Modeler benchmark: fit time per model type and prediction rate over a batch.

    .venv/bin/python bench/modeler.py [--runs 7] [--batch 1000000]

Fit: each model of data/rubick-artifact/fit_points.csv, median of --runs fits (target < 0.2 s), and
beside it the error bound `rubick model fit` adds (`modeler.uncertainty.estimate`: out-of-fold folds and
16 bootstrap refits) and the folds alone (what `make_core` and the simulator compute).
Prediction: `ModelPredictor.predict` (iteration time + memory feasibility) over a prebuilt batch of
--batch configurations (plans x placements on the 8x8 testbed), median of --runs passes
(target >= 1,000,000 configurations/s).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controlplane.events import Plan  # noqa: E402
from modeler.configs import Config, ConfigBatch  # noqa: E402
from modeler.env import load_env  # noqa: E402
from modeler.fit import fit  # noqa: E402
from modeler.predictor import ModelPredictor  # noqa: E402
from modeler.spec import load_model  # noqa: E402
from modeler.uncertainty import estimate  # noqa: E402
from modeler.validate import MODEL_KEYS, measurements, read_table  # noqa: E402


def plans_for(gpus: int, batch: int) -> list[Plan]:
    out = []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8):
            if gpus % (tp * pp):
                continue
            dp = gpus // (tp * pp)
            if batch % dp:
                continue
            out.append(Plan(dp=dp, tp=tp, pp=pp))
            if tp == pp == 1:
                out += [Plan(dp=dp, gc=True), Plan(dp=dp, zero_stage=2), Plan(dp=dp, zero_stage=2, offload=True)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--batch", type=int, default=1_000_000)
    args = ap.parse_args()
    env = load_env(ROOT / "examples" / "envs" / "a800-8x8.yaml")
    rows = read_table(ROOT / "data" / "rubick-artifact" / "fit_points.csv")
    predictor = ModelPredictor(env)
    print(f"fit time per model (median of {args.runs} runs), and the error bound's beside it:")
    for key in MODEL_KEYS:
        model = load_model(ROOT / "examples" / "models" / f"{key}.yaml")
        pts = measurements(model, [r for r in rows if r["model"] == key])
        times, full, folds = [], [], []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            res = fit(model, env, pts)
            times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            estimate(model, env, pts, res)
            full.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            estimate(model, env, pts, res, n_samples=0)
            folds.append(time.perf_counter() - t0)
        predictor.set_model(model, res.params)
        print(f"  {key:<8} {statistics.median(times) * 1e3:8.1f} ms   ({len(pts.batch)} points)   error bound "
              f"{statistics.median(full) * 1e3:6.1f} ms (folds alone {statistics.median(folds) * 1e3:5.1f} ms)")

    model = predictor.models["gpt2"]
    placements = [(g,) for g in range(1, 9)] + [(8,) * n for n in range(2, 9)] + [(4,) * n for n in range(2, 9)]
    configs = [Config(plan=p, gpus_per_node=pl, cpus_per_gpu=4, global_batch_size=16)
               for pl in placements for p in plans_for(sum(pl), 16)]
    base = ConfigBatch.from_configs(configs, allow_tp_across_nodes=True)
    reps = -(-args.batch // len(base))
    batch = base.take(np.tile(np.arange(len(base)), reps)[: args.batch])
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        pred = predictor.predict("gpt2", batch)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(f"prediction: {len(batch):,} configurations ({len(base)} distinct) in {med * 1e3:.1f} ms "
          f"(median of {args.runs}) = {len(batch) / med:,.0f} configurations/s; "
          f"{int(pred.feasible.sum()):,} feasible")
    return 0


if __name__ == "__main__":
    sys.exit(main())
