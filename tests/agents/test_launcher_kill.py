"""A job the launcher kills (it did not checkpoint in time, or it is given up) leaves no process behind. torchrun
starts each worker in a session of its own, so killing torchrun's process group alone would leave the workers
training on the job's devices. Real torchrun and trainers on the CPU, launched by the agent's launcher."""

from __future__ import annotations

import os
import signal

import pytest

from agents.launcher import LocalLauncher

from .helpers import launch, poll_until, started_here, trainers, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_a_killed_job_leaves_no_worker_behind(tmp_path):
    launcher = LocalLauncher(tmp_path, "n0", None, lease_s=0, run_extra={"size": "tiny"})
    launch(launcher, 1)
    try:
        poll_until(launcher, lambda s: s.get("iteration", 0) >= 2)
        assert trainers(tmp_path), "no worker trains"
        launcher.kill("lease-job")
        assert wait_until(lambda: not started_here(tmp_path), 30), f"left running: {started_here(tmp_path)}"
    finally:
        for pid in started_here(tmp_path):
            os.kill(pid, signal.SIGKILL)
