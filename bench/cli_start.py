"""How long the `rubick` command takes before it does anything, and a one-job submission end to end.

Medians of several fresh interpreters, alternating:

  help       `rubick --help` (only the command table: no command module imported)
  all        every command module imported, as `rubick` did before it imported only the command given
  submit -h  `rubick submit --help` (the submit command's module alone)
  submit     `rubick submit JOB.yaml` against a running `rubick up --insecure`: parse, connect, publish,
             and wait for admission's and the policy's verdict

    .venv/bin/python bench/cli_start.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "examples" / "jobs" / "roberta-small.yaml"
CLI = [sys.executable, "-m", "controlplane.cli"]


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - t0
    if done.returncode not in (0, 2):
        raise SystemExit(f"{' '.join(argv)} failed: {done.stdout[-500:]}{done.stderr[-500:]}")
    return took


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args(argv)
    rows: dict[str, list[float]] = {"help": [], "all": [], "submit -h": [], "submit": []}
    with tempfile.TemporaryDirectory(prefix="rubick-cli-") as tmp:
        rk = Path(tmp) / "rk"
        up = subprocess.Popen([*CLI, "up", "--data-dir", str(rk), "--port", "0", "--metrics-port", "-1",
                               "--tick-period", "0", "--insecure"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        try:
            if "ready in" not in up.stdout.readline():
                raise SystemExit("rubick up did not start")
            url = json.loads((rk / "endpoints.json").read_text())["nats_url"]
            job = yaml.safe_load(JOB.read_text())
            for i in range(args.runs):
                rows["help"].append(timed([*CLI, "--help"]))
                rows["all"].append(timed([sys.executable, "-c", "from controlplane.cli import build_parser; "
                                                                "build_parser()"]))
                rows["submit -h"].append(timed([*CLI, "submit", "--help"]))
                path = Path(tmp) / f"job-{i}.yaml"
                path.write_text(yaml.safe_dump({**job, "job_id": f"bench-{i}"}))
                rows["submit"].append(timed([*CLI, "submit", str(path), "--nats-url", url]))
        finally:
            up.send_signal(signal.SIGINT)
            up.communicate(timeout=60)
    print(f"rubick start-up, medians of {args.runs} fresh interpreters (python -m controlplane.cli)")
    for name, xs in rows.items():
        print(f"  {name:10s} {statistics.median(xs):7.3f} s")
    print(f"  help / all: {statistics.median(rows['help']) / statistics.median(rows['all']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
