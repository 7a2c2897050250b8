"""A benchmark that starts training processes leaves none behind, however it is stopped: SIGTERM (a time
limit) or kill -9. Real `bench/reconfigure.py`, real torchrun and trainers on the CPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import started_here, trainers, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_the_reconfiguration_benchmark_leaves_no_trainer_behind(tmp_path, sig):
    bench = subprocess.Popen([sys.executable, str(REPO / "bench" / "reconfigure.py"), "--runs", "1",
                              "--changes", "dp1-z0 -> dp2-z1"], cwd=REPO, env={**os.environ, "TMPDIR": str(tmp_path)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_until(lambda: trainers(tmp_path), 120), "no trainer started"
        bench.send_signal(sig)
        bench.wait(60)
        assert wait_until(lambda: not started_here(tmp_path), 60), f"left running: {started_here(tmp_path)}"
    finally:
        for pid in started_here(tmp_path):
            os.kill(pid, signal.SIGKILL)
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
