"""A day of a production trace's shape: rows in the Alibaba PAI GPU trace's task-table format
(cluster-trace-gpu-v2020 `pai_task_table`: job_name, task_name, inst_num, status, start_time, end_time,
plan_cpu, plan_mem, plan_gpu, gpu_type), generated with a fixed seed, then simulated with
`rubick simulate --layout pai`. Real PAI rows cannot be downloaded here, so the generator keeps to the
published schema and to the trace's published shape, without claiming its numbers:

- arrivals over one day with a daily swing (busier in the working hours), in bursts of a user's jobs;
- most jobs one task, some with a few (a worker and a parameter server, or several workers);
- `plan_gpu` in percent of one GPU: mostly 100, some fractional (25, 50) and some several (200-800);
  a few tasks ask for none (CPU-only, filtered by the import); a few jobs ask for more than a node;
- `plan_cpu` 100-1,200 (percent of a CPU) per instance, `plan_mem` in GB;
- durations log-normal (a median of minutes, a tail of many hours);
- statuses mostly Terminated, some Failed, Running or Waiting (filtered by the import).

    .venv/bin/python bench/pai_day.py                      # 20,000 rows; 80x8, then 8x8
    .venv/bin/python bench/pai_day.py --rows 2000 --clusters 8x8 --write runs/pai/pai_task_table.csv

Prints the rows and jobs generated, then per cluster the wall time, the peak memory of the simulation
process, the jobs done, reconfigurations and preemptions per job, and what the import left out.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from replay.importers import PAI_COLUMNS, PAI_JOB_COLUMNS  # noqa: E402

DAY_S = 86_400
T0 = 1_705_270  # the trace's own time origin: seconds into its recording
STATUSES = (("Terminated", 0.78), ("Failed", 0.12), ("Running", 0.06), ("Waiting", 0.04))
GPU_SHARES = ((100, 0.52), (50, 0.14), (25, 0.06), (200, 0.08), (400, 0.06), (800, 0.08), (0, 0.06))
GPU_TYPES = ("V100", "P100", "T4", "MISC", "V100M32")


def _pick(rng: random.Random, table) -> object:
    x, acc = rng.random(), 0.0
    for value, p in table:
        acc += p
        if x < acc:
            return value
    return table[-1][0]


def _arrival(rng: random.Random) -> float:
    """A time of day, busier from 9 to 21 (a sine swing of 3:1 between day and night)."""
    while True:
        t = rng.uniform(0, DAY_S)
        if rng.random() < (2 + math.sin((t / DAY_S - 0.25) * 2 * math.pi)) / 3:
            return t


def generate(rows: int, seed: int = 1) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """`rows` task rows (a job's tasks together) and the job table's rows (`pai_job_table`: each job's user
    and submission, a little before its first task starts), deterministic for a seed."""
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    job_rows: list[dict[str, object]] = []
    job = 0
    while len(out) < rows:
        user = f"user{rng.randrange(400):03d}"
        burst = 1 + int(rng.expovariate(1 / 2.5))  # a user submits a few jobs together
        start0 = _arrival(rng)
        for b in range(burst):
            if len(out) >= rows:
                break
            job += 1
            name = f"{seed:02d}{job:07d}{rng.getrandbits(24):06x}"
            status = _pick(rng, STATUSES)
            start = start0 + b * rng.expovariate(1 / 30.0)
            duration = min(7 * DAY_S, rng.lognormvariate(math.log(900), 1.6))
            gpu = _pick(rng, GPU_SHARES)
            tasks = [("worker", 1 + (int(rng.expovariate(1 / 1.5)) if rng.random() < 0.2 else 0))]
            if rng.random() < 0.1:
                tasks.append(("ps", 1))
            if rng.random() < 0.004:  # a job over one node: many workers of a whole GPU each
                tasks = [("worker", rng.randrange(9, 80))]
                gpu = 100
            job_rows.append({"job_name": name, "inst_id": rng.getrandbits(32), "user": user, "status": status,
                             "start_time": int(T0 + start - rng.expovariate(1 / 60.0)),
                             "end_time": int(T0 + start + duration)})
            for task, inst in tasks:
                share = gpu if task == "worker" else 0
                out.append({"job_name": name, "task_name": task, "inst_num": inst, "status": status,
                            "start_time": int(T0 + start), "end_time": int(T0 + start + duration),
                            "plan_cpu": rng.choice((100, 200, 400, 600, 800, 1200)),
                            "plan_mem": round(rng.uniform(4, 120), 2), "plan_gpu": share,
                            "gpu_type": rng.choice(GPU_TYPES) if share else ""})
    kept = {r["job_name"] for r in out[:rows]}
    return out[:rows], [j for j in job_rows if j["job_name"] in kept]


def write(rows: list[dict[str, object]], path: Path, columns=PAI_COLUMNS) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        w.writerows(rows)


def simulate(trace: Path, jobs_table: Path, cluster: str, out: Path, timeout_s: float) -> dict[str, object]:
    """`rubick simulate` in a child process: its wall time, peak memory and summary."""
    cmd = [sys.executable, "-m", "controlplane.cli", "simulate", "--trace", str(trace), "--layout", "pai",
           "--pai-job-table", str(jobs_table), "--cluster", cluster, "--policy", "rubick", "--out", str(out),
           "--max-time-h", "2000", "--no-progress"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        text, _ = proc.communicate(timeout=timeout_s)
        code = proc.returncode
    except subprocess.TimeoutExpired:  # stop it as a user would: it writes what it simulated so far, then exits
        proc.terminate()
        try:
            text, _ = proc.communicate(timeout=120)
            code = f"stopped at the {timeout_s:g} s limit"
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
            code = f"killed at the {timeout_s:g} s limit"
    wall = time.perf_counter() - t0
    peak_mb = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before) / 1024
    summary = {}
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        pass
    return {"code": code, "wall_s": wall, "peak_mb": peak_mb, "summary": summary, "text": text}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--clusters", default="80x8,8x8", help="comma-separated NODESxGPUS (default 80x8,8x8)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds each simulation may take")
    ap.add_argument("--write", type=Path, help="also keep the generated trace here (its job table beside it, "
                                               "pai_job_table.csv)")
    args = ap.parse_args()

    from machine import line as machine_line
    print(machine_line())
    rows, job_rows = generate(args.rows, args.seed)
    jobs = {r["job_name"] for r in rows}
    gpu_jobs = {r["job_name"] for r in rows if r["status"] == "Terminated" and float(r["plan_gpu"]) > 0}
    print(f"generated {len(rows):,} rows of {len(jobs):,} jobs (seed {args.seed}); "
          f"{len(gpu_jobs):,} Terminated jobs that ask for GPUs")
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.write or Path(tmp) / "pai_task_table.csv"
        jobs_table = trace.with_name("pai_job_table.csv")
        trace.parent.mkdir(parents=True, exist_ok=True)
        write(rows, trace)
        write(job_rows, jobs_table, PAI_JOB_COLUMNS)
        for cluster in args.clusters.split(","):
            res = simulate(trace, jobs_table, cluster, Path(tmp) / f"run-{cluster}", args.timeout)
            s = res["summary"]
            line = (f"{cluster}: exit {res['code']}, {res['wall_s']:.1f} s wall, peak {res['peak_mb']:.0f} MB; ")
            if s:
                jobs_of = s.get("jobs", {})
                n = max(1, jobs_of.get("submitted", 0))
                recon, pre = s.get("reconfigurations", 0), s.get("preemptions", 0)
                line += (f"{jobs_of.get('completed', 0):,}/{n:,} jobs done ({s.get('stop_reason', '')}); "
                         f"{recon:,} reconfigurations ({recon / n:.2f} per job), {pre:,} preemptions "
                         f"({pre / n:.2f} per job); capped {s.get('trace_capped', 0)}, filtered rows "
                         f"{s.get('trace_filtered', 0)}, after max time {s.get('trace_after_max_time', 0)}")
            else:
                line += "no summary written"
            print(line)
            tail = [x for x in res["text"].splitlines() if x.strip()][-2:]
            for x in tail:
                print("    " + x[:200])
    print(machine_line(), "(after)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
