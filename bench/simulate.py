"""Trace simulation speed: wall time, peak memory, events per second and the time split.

    .venv/bin/python bench/simulate.py                       # Base trace, rubick, 3 runs
    .venv/bin/python bench/simulate.py --scale 10 --runs 1   # the 10x trace on 80x8 GPUs
    .venv/bin/python bench/simulate.py --policy sia --trace data/rubick-artifact/workload-mt.csv

Each run is a fresh process (so its peak RSS is its own) that imports the project, loads the specs,
table and fitted parameters (from the fit cache, warmed once before timing), reads the trace,
simulates and writes the event log to a temporary folder. Printed: the median over runs of the
process wall time, the simulation's wall time (the loop from the first event to the last), the
time spent in each core (policy, modeler, admission, simulated agents) and in the simulator
itself, writing the log, events per second, and peak RSS. A verification replay of the last run
is timed too, as often as the runs (`--no-replay` skips it): the policy core only, all cores in one
process, and all cores side by side (the default).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def one(args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    from replay.config import RunConfig, default_cache_dir, load_parts
    from replay.importers import read_trace
    from replay.run import simulate, trace_inputs
    from replay.trace import scale_trace

    t_import = time.perf_counter() - t0
    parts = load_parts(cache_dir=default_cache_dir())
    jobs = scale_trace(read_trace(args.trace, parts.batches).jobs, args.scale)
    cfg = RunConfig(policy=args.policy, cluster=args.cluster, scale=args.scale)
    t_setup = time.perf_counter() - t0
    out = simulate(cfg, trace_inputs(cfg, jobs, parts), parts, out_dir=Path(args.out))
    wall = time.perf_counter() - t0
    r = out.result
    print(json.dumps({"process_s": wall, "import_s": t_import, "setup_s": t_setup, "sim_s": r.wall_s,
                      "write_s": out.write_s, "events": len(r.events), "split": r.core_seconds,
                      "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "avg_jct_h": out.summary["jct"]["avg_h"], "jobs": len(jobs),
                      "sha": out.summary["plan_decided_sha256"]}))


def replay_once(log: Path, only: str | None, jobs: int | None) -> dict:
    cmd = [sys.executable, "-c",
           "import sys, json, time; sys.path.insert(0, %r)\n"
           "t0 = time.perf_counter()\n"
           "from replay.verify import verify\n"
           "r = verify(%r, only=%r, jobs=%r)\n"
           "print(json.dumps({'process_s': time.perf_counter() - t0, 'verify_s': r.seconds, 'ok': r.ok, "
           "'simulated_s': r.simulated_s, 'processes': r.processes}))"
           % (str(ROOT), str(log), None if only is None else (only,), jobs)]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=ROOT / "data" / "rubick-artifact" / "workload-base.csv")
    p.add_argument("--policy", default="rubick")
    p.add_argument("--scale", type=int, default=1)
    p.add_argument("--cluster", help="default: 8x8 times the scale (80x8 for --scale 10)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-replay", action="store_true")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.cluster = args.cluster or f"{8 * args.scale}x8"
    if args.one:
        one(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        warm = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                "from replay.config import load_parts, default_cache_dir; load_parts(cache_dir=default_cache_dir())"]
        subprocess.run(warm, check=True)
        from machine import line as machine_line
        print(machine_line())
        results = []
        for i in range(args.runs):
            cmd = [sys.executable, __file__, "--one", "--trace", str(args.trace), "--policy", args.policy,
                   "--scale", str(args.scale), "--cluster", args.cluster, "--out", f"{tmp}/run{i}"]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode:
                sys.exit(res.stderr)
            results.append(json.loads(res.stdout.strip().splitlines()[-1]))
        med = lambda key: statistics.median(r[key] for r in results)  # noqa: E731
        split = {k: statistics.median(r["split"][k] for r in results) for k in results[0]["split"]}
        same = len({r["sha"] for r in results}) == 1
        print(f"trace {args.trace.name} x{args.scale} ({results[0]['jobs']} jobs) on {args.cluster}, policy "
              f"{args.policy}: median of {args.runs} run(s)")
        print(f"  process wall {med('process_s'):.2f} s (imports {med('import_s'):.2f} s, setup "
              f"{med('setup_s') - med('import_s'):.2f} s), simulation {med('sim_s'):.2f} s, writing the log "
              f"{med('write_s'):.2f} s, peak RSS {med('rss_mb'):.0f} MB")
        print(f"  {results[0]['events']} events, {results[0]['events'] / med('sim_s'):,.0f} events/s; "
              f"avg JCT {results[0]['avg_jct_h']:.3f} h; identical decisions in every run: {same}")
        print("  time split: " + ", ".join(f"{k} {v:.2f} s ({v / med('sim_s'):.0%})"
                                          for k, v in sorted(split.items(), key=lambda kv: -kv[1])))
        if not args.no_replay:
            log = Path(tmp) / f"run{args.runs - 1}" / "events"
            modes = (("policy core only", "policy", None), ("all cores", None, 1), ("all cores", None, None))
            checks: list[list[dict]] = [[] for _ in modes]
            for _ in range(args.runs):  # interleaved, so that a noisy spell hits every mode alike
                for rs, (_, only, jobs) in zip(checks, modes):
                    rs.append(replay_once(log, only, jobs))
            for rs, (what, _, _) in zip(checks, modes):
                v = statistics.median(r["verify_s"] for r in rs)
                print(f"  replay check ({what}, {rs[0]['processes']} process(es)): {v:.2f} s (process "
                      f"{statistics.median(r['process_s'] for r in rs):.2f} s), "
                      f"{rs[0]['simulated_s'] / max(v, 1e-9):,.0f}x faster than simulated time, "
                      f"ok={all(r['ok'] for r in rs)}")
        print(machine_line(), "(after)")


if __name__ == "__main__":
    main()
