"""Run the example trainer directly (no agent): for the accuracy test and the reconfiguration benchmark.

The processes listen on 127.0.0.1 only, live in their own process group, and end with the process
that started them (on Linux, when started from its main thread); `kill_group` ends them at once.

    status = run(job_dir, {"plan": {"dp": 2, "zero_stage": 2}, "global_batch_size": 8,
                           "target_iterations": 40}, nproc=2)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
TRAINER = Path(__file__).resolve().parent / "train.py"

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agents.plan_config import loopback_args, trainer_command  # noqa: E402
from controlplane.lifetime import die_with_parent  # noqa: E402
from examples.trainer.forks import Forked, Forks


def launch_env() -> dict[str, str]:
    """The environment of the runner's launches: the repository importable, one thread a process, sockets on the
    loopback interface."""
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
            "NCCL_SOCKET_IFNAME": "lo"}


def start(job_dir: Path, run: dict[str, Any], nproc: int, attempt: int = 1,
          script: Path = TRAINER, warm: bool = True, forks: Forks | None = None) -> subprocess.Popen | Forked:
    """Write the run file and start torchrun with `nproc` processes running `script`; returns at once. `warm`: the
    processes of the project's trainer scripts are forked from torchrun with their modules imported
    (`agents.torchrun`); this runner trains on the CPU, where that is safe. `forks`: torchrun itself is forked from
    that warm process (`examples.trainer.forks`, started with `launch_env()`) instead of started afresh."""
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "control").mkdir(exist_ok=True)
    (job_dir / "control" / "stop").unlink(missing_ok=True)
    (job_dir / "status.json").unlink(missing_ok=True)
    doc = {"job_id": "local", "model_type": "example", "seed": 0, "gpus_per_node": [nproc], "node": "local",
           **run, "job_dir": str(job_dir), "attempt": attempt}
    run_file = job_dir / f"run-a{attempt}.json"
    run_file.write_text(json.dumps(doc))
    cmd = trainer_command(sys.executable, loopback_args(f"local-{attempt}", nproc), str(script), [str(run_file)],
                          warm=warm or forks is not None)
    if forks is not None:
        (job_dir / f"log-a{attempt}.txt").write_bytes(b"")
        return forks.start(cmd, REPO, job_dir / f"log-a{attempt}.txt")
    env = launch_env()
    with open(job_dir / f"log-a{attempt}.txt", "wb") as log:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=die_with_parent(signal.SIGTERM))


def kill_group(proc: subprocess.Popen | Forked) -> None:
    """SIGKILL torchrun and its workers (its process group), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def status(job_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((job_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def wait_for(job_dir: Path, proc: subprocess.Popen | Forked, what: Callable[[dict[str, Any]], bool],
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
    kill_group(proc)
    raise TimeoutError(f"trainer did not get there in {timeout} s: {tail(job_dir)}")


def tail(job_dir: Path, lines: int = 20) -> str:
    logs = sorted(job_dir.glob("log-a*.txt"))
    return "\n".join(logs[-1].read_text(errors="replace").splitlines()[-lines:]) if logs else ""


def run(job_dir: Path, run: dict[str, Any], nproc: int, attempt: int = 1, timeout: float = 300.0,
        forks: Forks | None = None) -> dict[str, Any]:
    """Run to the end (completed, or checkpointed at `stop_after`) and return the final status (`forks`: see
    `start`)."""
    proc = start(job_dir, run, nproc, attempt, forks=forks)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise TimeoutError(f"trainer ran past {timeout} s: {tail(job_dir)}") from None
    st = status(job_dir)
    if proc.returncode != 0 or st.get("state") not in ("completed", "checkpointed"):
        said = st.get("error") or tail(job_dir)
        raise RuntimeError(f"trainer exited with {proc.returncode} in state {st.get('state')}: {said}")
    return st
