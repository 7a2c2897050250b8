"""Profile the example trainer's tiny GPT on this machine, 3D plans included, fit the performance model on
part of what was measured and predict the rest: predicted against measured iteration time for the plans
that were not fitting points.

    .venv/bin/python bench/profile_3d.py                       # 4 CPU devices, 3 runs, TP 4 and TP2xPP2 held out
    .venv/bin/python bench/profile_3d.py --devices 2 --runs 1 --hold-out dp1-tp2-pp1-z0-ga1

Each run is `rubick profile --cpu-devices N` (every DP, ZeRO, offload, GA and GC plan of the sample and
the TP and PP plans the model's 4 heads and 2 layers allow), then `rubick model fit` on every measured
plan but the held-out ones and `rubick model predict` of those. The figures are the medians over the
runs of the measured time, the predicted time and their ratio.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "examples" / "trainer" / "tiny-gpt.yaml"
HELD_OUT = ("dp1-tp4-pp1-z0-ga1", "dp1-tp2-pp2-z0-ga1-mb8")


def rubick(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "controlplane.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"rubick {' '.join(args[:2])} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def one_run(devices: int, held: tuple[str, ...], tmp: Path) -> tuple[dict[str, tuple[float, float]], str]:
    rubick("profile", "--spec", str(SPEC), "--cpu-devices", str(devices), "--no-publish", "--warmup", "2",
           "--iterations", "5", "--out", "points.csv", "--out-spec", "spec.yaml", cwd=tmp)
    rows = list(csv.DictReader(open(tmp / "points.csv")))
    missing = [h for h in held if h not in {r["plan_label"] for r in rows}]
    if missing:
        raise SystemExit(f"not profiled on {devices} devices: {', '.join(missing)}")
    for name, keep in (("fit.csv", lambda r: r["plan_label"] not in held), ("held.csv", lambda r: r["plan_label"] in held)):
        with open(tmp / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(r for r in rows if keep(r))
    fitted = rubick("model", "fit", "--spec", "spec.yaml", "--points", "fit.csv", "--out", "params.json", cwd=tmp)
    rubick("model", "predict", "--spec", "spec.yaml", "--params", "params.json", "--configs", "held.csv",
           "--out", "pred.csv", cwd=tmp)
    out = {r["plan_label"]: (float(r["iter_time_s"]), float(r["pred_iter_time_s"]))
           for r in csv.DictReader(open(tmp / "pred.csv"))}
    return out, fitted.splitlines()[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hold-out", action="append", default=None, metavar="PLAN",
                    help=f"plan code not to fit on, predicted instead (default: {', '.join(HELD_OUT)})")
    args = ap.parse_args(argv)
    held = tuple(args.hold_out or HELD_OUT)
    results: dict[str, list[tuple[float, float]]] = {h: [] for h in held}
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="rubick-profile-3d-") as tmp:
            got, fit_line = one_run(args.devices, held, Path(tmp))
        print(f"run {i + 1}: {fit_line}")
        for plan, pair in got.items():
            results[plan].append(pair)
    print(f"\ntiny GPT on {args.devices} CPU devices; fitted on every profiled plan but these; medians of "
          f"{args.runs} runs")
    print(f"{'plan':28s} {'measured s':>11s} {'predicted s':>12s} {'pred/meas':>10s}")
    for plan in held:
        meas = statistics.median(m for m, _ in results[plan])
        pred = statistics.median(p for _, p in results[plan])
        ratio = statistics.median(p / m for m, p in results[plan])
        print(f"{plan:28s} {meas:11.4f} {pred:12.4f} {ratio:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
