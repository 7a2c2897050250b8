"""A user's own training code under the local launcher: a real nats-server, `rubick agent --cpu-devices 2`,
the Hugging Face-style script of examples/workloads (not the example trainer) trained with DeepSpeed,
a plan change in the middle (DP=2 ZeRO-2 -> DP=1 ZeRO-Offload GA=2) resumed from the workload's own
checkpoint folder, and the workloads the local launcher cannot run answered with job.failed."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path

import pytest

from controlplane.events import Plan
from controlplane.events.workload import CheckpointVolume, Workload

from .helpers import Watcher, decide, decision, job, kill_jobs, publish, start_agent, stop_agent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
DP2_Z2 = Plan(dp=2, zero_stage=2)
DP1_OFFLOAD_GA2 = Plan(dp=1, zero_stage=2, offload=True, ga_steps=2)
TARGET = 60


def hf_job(job_id: str, ckpt: Path | None, **workload) -> object:
    w = Workload(command=(sys.executable, "examples/workloads/hf_gpt2.py"), working_dir=str(REPO),
                 env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"},
                 checkpoint=CheckpointVolume(host_path=str(ckpt)) if ckpt else None)
    return dataclasses.replace(job(job_id, target=TARGET), workload=dataclasses.replace(w, **workload))


async def test_own_training_code_runs_reconfigures_and_resumes(js_bus, tmp_path):
    watch = await Watcher().start(js_bus)
    agent = start_agent(js_bus.nc.connected_url.geturl(), tmp_path / "agent")
    ckpt = tmp_path / "user-ckpt"
    try:
        await publish(js_bus, "job.submitted", hf_job("hf1", ckpt))
        await decide(js_bus, decision("hf1", DP2_Z2, gpus=2, cpus=2))
        await watch.until(lambda: len(watch.of("metrics.iteration", "hf1")) >= 3, 180, "iterations under DP=2")
        await decide(js_bus, decision("hf1", DP1_OFFLOAD_GA2, gpus=1, cpus=1), round=2)
        (done,) = await watch.until(lambda: watch.of("job.completed", "hf1"), 240, "job.completed")
        assert done.payload.iterations == TARGET
        (reconf,) = watch.of("job.reconfigured", "hf1")
        assert reconf.payload.plan == DP1_OFFLOAD_GA2
        metrics = watch.of("metrics.iteration", "hf1")
        assert {e.payload.plan for e in metrics} == {DP2_Z2, DP1_OFFLOAD_GA2}
        assert sorted({e.payload.iteration for e in metrics}) == list(range(TARGET)), \
            "every iteration once: the second plan resumed where the first checkpointed"
        assert not watch.of("job.failed")
    finally:
        stop_agent(agent)
        kill_jobs(tmp_path / "agent")

    assert (ckpt / "checkpoint.pt").exists(), "the checkpoint is in the workload's own folder"
    job_dir = tmp_path / "agent" / "n0" / "jobs" / "hf1"
    if not job_dir.exists():
        job_dir = next((tmp_path / "agent").rglob("jobs/hf1"))
    status = json.loads((job_dir / "status.json").read_text())
    assert status["state"] == "completed" and status["plan"] == DP1_OFFLOAD_GA2.code()
    ds = json.loads((job_dir / "deepspeed-a2.json").read_text())
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu" and ds["gradient_accumulation_steps"] == 2
    run = json.loads((job_dir / "run-a2.json").read_text())
    assert run["micro_batch_size"] == 4 and run["plan"]["offload"] is True


BAD = [  # (job, what the local launcher cannot run, what job.failed says)
    ("bad-none", {"command": ()}, "has none"),
    ("bad-pvc", {"checkpoint": CheckpointVolume(pvc="team-ckpt")}, "cannot mount PVC team-ckpt"),
    ("bad-exit", {"command": ("/nonexistent/bin/train",)}, "exited with code"),
]


async def test_workloads_the_local_launcher_cannot_run_fail_the_job_and_free_the_node(js_bus, tmp_path):
    """Each is decided on the same two devices as the one before failed on them: each fails with its reason, and
    the devices are free again after every failure (the next job gets them and runs)."""
    watch = await Watcher().start(js_bus)
    agent = start_agent(js_bus.nc.connected_url.geturl(), tmp_path / "agent")
    try:
        for job_id, workload, _ in BAD:
            await publish(js_bus, "job.submitted", hf_job(job_id, None, **workload))
        await publish(js_bus, "job.submitted", job("good", target=5))
        for round_no, (job_id, _, reason) in enumerate(BAD, start=1):
            await decide(js_bus, decision(job_id, DP2_Z2, gpus=2, cpus=1), round=round_no)
            (failed,) = await watch.until(lambda: watch.of("job.failed", job_id), 120, f"job.failed of {job_id}")
            assert reason in failed.payload.reason or reason in failed.payload.log_tail, failed.payload
        await decide(js_bus, decision("good", DP2_Z2, gpus=2, cpus=1), round=len(BAD) + 1)
        await watch.until(lambda: watch.of("job.completed", "good"), 180, "the next job completes")
        assert not watch.of("job.failed", "good")
    finally:
        stop_agent(agent)
        kill_jobs(tmp_path / "agent")
