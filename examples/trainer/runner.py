"""Run the example trainer directly (no agent): for the accuracy test and the reconfiguration benchmark.

    status = run(job_dir, {"plan": {"dp": 2, "zero_stage": 2}, "global_batch_size": 8,
                           "target_iterations": 40}, nproc=2)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
TRAINER = Path(__file__).resolve().parent / "train.py"


def start(job_dir: Path, run: dict[str, Any], nproc: int, attempt: int = 1,
          script: Path = TRAINER) -> subprocess.Popen:
    """Write the run file and start torchrun with `nproc` processes running `script`; returns at once."""
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "control").mkdir(exist_ok=True)
    (job_dir / "control" / "stop").unlink(missing_ok=True)
    (job_dir / "status.json").unlink(missing_ok=True)
    doc = {"job_id": "local", "model_type": "example", "seed": 0, "gpus_per_node": [nproc], "node": "local",
           **run, "job_dir": str(job_dir), "attempt": attempt}
    run_file = job_dir / f"run-a{attempt}.json"
    run_file.write_text(json.dumps(doc))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    log = open(job_dir / f"log-a{attempt}.txt", "wb")
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                             f"--nproc-per-node={nproc}", str(script), str(run_file)], cwd=REPO, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def status(job_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((job_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def wait_for(job_dir: Path, proc: subprocess.Popen, what: Callable[[dict[str, Any]], bool],
             timeout: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = status(job_dir)
        if what(st):
            return st
        if proc.poll() is not None:
            st = status(job_dir)
            if what(st):
                return st
            raise RuntimeError(f"trainer exited with {proc.returncode}: {tail(job_dir)}")
        time.sleep(0.02)
    proc.kill()
    raise TimeoutError(f"trainer did not get there in {timeout} s: {tail(job_dir)}")


def tail(job_dir: Path, lines: int = 20) -> str:
    logs = sorted(job_dir.glob("log-a*.txt"))
    return "\n".join(logs[-1].read_text(errors="replace").splitlines()[-lines:]) if logs else ""


def run(job_dir: Path, run: dict[str, Any], nproc: int, attempt: int = 1, timeout: float = 300.0) -> dict[str, Any]:
    """Run to the end (completed, or checkpointed at `stop_after`) and return the final status."""
    proc = start(job_dir, run, nproc, attempt)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise TimeoutError(f"trainer ran past {timeout} s: {tail(job_dir)}") from None
    st = status(job_dir)
    if proc.returncode != 0 or st.get("state") not in ("completed", "checkpointed"):
        raise RuntimeError(f"trainer exited with {proc.returncode} in state {st.get('state')}: {tail(job_dir)}")
    return st
