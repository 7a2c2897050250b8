"""The example trainer on CPU devices starts warm: its processes are forks of torchrun, which imported torch,
DeepSpeed and the trainer first (`agents.torchrun --preload`, torchrun's `--start-method=fork --run-path`); started
cold they are processes of their own. Either way they train, and a torchrun stopped by SIGTERM passes the stop on: the
workers checkpoint and end, released at once rather than killed by torchrun 30 s later. Real torchrun and trainers
on the CPU, launched by the agent's launcher."""

from __future__ import annotations

import os
import signal

import pytest

from agents.core import Launch
from agents.launcher import LocalLauncher
from agents.plan_check import JobInfo
from controlplane.events import NodeShare, Plan
from controlplane.lifetime import cmdline

from .helpers import poll_until, started_here, status, trainers, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def launch_two(launcher: LocalLauncher) -> None:
    share = NodeShare(node="n0", gpus=2, cpus=2)
    launcher.launch(Launch(job=JobInfo("lease-job", "example", 4, 1_000_000), plan=Plan(dp=2), allocation=(share,),
                           share=share, attempt=1, devices=(0, 1), cpu_cores=()))


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_workers_start_warm_on_cpu_devices_and_end_on_torchruns_sigterm(tmp_path, warm):
    launcher = LocalLauncher(tmp_path, "n0", None, lease_s=0, run_extra={"size": "tiny"}, warm=warm)
    assert launcher.warm_start is warm
    assert not LocalLauncher(tmp_path, "n0", None, cpu_devices=False).warm_start, "GPU devices start cold"
    launch_two(launcher)
    torchrun = launcher.procs["lease-job"].pid
    try:
        poll_until(launcher, lambda s: s.get("iteration", 0) >= 2)
        workers = trainers(tmp_path)
        assert len(workers) == 2, workers
        forked = [cmdline(p) == cmdline(torchrun) for p in workers]
        assert forked == [warm, warm], (cmdline(torchrun), [cmdline(p) for p in workers])
        assert ("--preload=examples.trainer.train,torch._dynamo" in cmdline(torchrun)) is warm

        os.kill(torchrun, signal.SIGTERM)  # a node shutting down: torchrun passes the signal to its workers
        assert wait_until(lambda: not started_here(tmp_path), 60), f"left running: {started_here(tmp_path)}"
        st = status(launcher)
        assert st.get("state") == "checkpointed" and st.get("stopped_by") == "sigterm", st
        log = (launcher.job_dir("lease-job") / "log-a1.txt").read_text(errors="replace")
        assert "forcefully exiting" not in log, log[-2000:]  # torchrun's kill of a worker that did not end
    finally:
        for pid in started_here(tmp_path):
            os.kill(pid, signal.SIGKILL)


def test_only_the_projects_trainer_scripts_are_run_in_a_fork(tmp_path):
    from agents.plan_config import TRAINER_DIR, trainer_command, warm_modules

    assert warm_modules(TRAINER_DIR / "train.py") == ("examples.trainer.train", "torch._dynamo")
    assert warm_modules(TRAINER_DIR / "profile_run.py") == ("examples.trainer.profile_run", "torch._dynamo")
    own = tmp_path / "train.py"  # a user's script of the same name elsewhere
    own.write_text("")
    assert warm_modules(own) == () and warm_modules(TRAINER_DIR / "runner.py") == ()
    cold = trainer_command("python", ["--nnodes=1"], str(own), ["RUN"], warm=True)
    assert cold == ["python", "-m", "agents.torchrun", "--nnodes=1", str(own), "RUN"]
    warm = trainer_command("python", ["--nnodes=1"], str(TRAINER_DIR / "train.py"), ["RUN"], warm=True)
    assert warm[3] == "--preload=examples.trainer.train,torch._dynamo"  # agents.torchrun reads it first
    assert warm[4:] == ["--nnodes=1", "--start-method=fork", "--run-path", str(TRAINER_DIR / "train.py"), "RUN"]
    assert "--run-path" not in trainer_command("python", [], str(TRAINER_DIR / "train.py"), [], warm=False)
    assert LocalLauncher(tmp_path, "n0", None, trainer=own).warm_start is False


def test_the_agent_starts_warm_unless_told_not_to():
    import argparse

    from agents.cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert parser.parse_args(["agent"]).warm_start is True
    assert parser.parse_args(["agent", "--no-warm-start"]).warm_start is False
