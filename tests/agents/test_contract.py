"""The training contract (agents.contract, docs/workloads.md): what the launcher hands every rank and what
the training code hands back, checked on real files and a real signal."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from agents import contract
from agents.contract import Files, TrainingJob
from controlplane.client import load_job
from controlplane.events import NodeShare, Plan

REPO = Path(__file__).resolve().parents[2]
PLAN = Plan(dp=2, zero_stage=2, offload=True, ga_steps=2)


def launched(tmp_path: Path, **files) -> tuple[dict, dict[str, str]]:
    share = NodeShare(node="n0", gpus=2, cpus=8, mem_gb=64.0)
    run = contract.run_record("j1", "gpt2", PLAN, (share,), share, "n0", 3, 16, 500, "nats://h:4222",
                              str(tmp_path), lr=1e-3)
    f = contract.local_files(tmp_path, 3)
    f = Files(**{**f.__dict__, **files})
    Path(f.run_file).write_text(json.dumps(run))
    Path(f.deepspeed_config).write_text(json.dumps(contract.deepspeed_file_content(run)))
    return run, contract.contract_env(run, f, lease_s=30.0)


def test_the_plan_reaches_the_code_through_the_environment(tmp_path):
    run, env = launched(tmp_path)
    assert run["micro_batch_size"] == 4 and run["cpus_per_gpu"] == 4 and run["gpus_per_node"] == [2]
    assert json.loads(env["RUBICK_PLAN"]) == run["plan"] and env["RUBICK_ATTEMPT"] == "3"
    assert (env["RUBICK_GLOBAL_BATCH_SIZE"], env["RUBICK_MICRO_BATCH_SIZE"], env["RUBICK_GA_STEPS"]) == ("16", "4", "2")
    assert env["RUBICK_NATS_URL"] == "nats://h:4222" and env["RUBICK_AGENT_LEASE_S"] == "30"
    assert all(k.startswith("RUBICK_") for k in env)
    job = TrainingJob.from_env(env, catch_sigterm=False)
    assert job.plan == PLAN and job.micro_batch_size == 4 and job.target_iterations == 500
    ds = job.deepspeed_config()
    assert ds["train_batch_size"] == 16 and ds["gradient_accumulation_steps"] == 2
    assert ds["zero_optimization"] == {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": False}}
    assert job.checkpoint_dir == tmp_path


def test_status_ready_and_termination_message(tmp_path):
    term = tmp_path / "termination-log"
    term.write_text("")
    _, env = launched(tmp_path, termination_log=str(term))
    job = TrainingJob.from_env(env, catch_sigterm=False)
    job.begin(0)
    assert contract.parse_status(Path(env["RUBICK_STATUS_FILE"]).read_text())["state"] == "running"
    assert not Path(env["RUBICK_READY_FILE"]).exists()
    job.iteration_done(1, loss=2.5)
    assert Path(env["RUBICK_READY_FILE"]).exists(), "the first iteration makes the pod ready"
    assert term.read_text() == "", "the termination message is the final status only"
    job.checkpointed(7, "agent")
    final = contract.parse_status(term.read_text())
    assert (final["state"], final["iteration"], final["stopped_by"]) == ("checkpointed", 7, "agent")
    assert contract.parse_status(Path(env["RUBICK_STATUS_FILE"]).read_text()) == final
    other = TrainingJob.from_env(env, catch_sigterm=False)
    other.rank = 1
    other.completed(9)
    assert contract.parse_status(term.read_text())["iteration"] == 7, "only rank 0 writes"
    for junk in (None, "", "not json", "[1]", '{"state": "exploded"}'):
        assert contract.parse_status(junk) == {}


def test_every_way_of_asking_for_a_stop(tmp_path):
    podinfo = tmp_path / "annotations"
    podinfo.write_text('kubernetes.io/config.seen="x"\nrubick.io/job-id="j1"\n')
    _, env = launched(tmp_path, podinfo=str(podinfo))
    job = TrainingJob.from_env(env, catch_sigterm=False)
    assert job.stop_reason() is None
    Path(env["RUBICK_STOP_FILE"]).parent.mkdir(parents=True, exist_ok=True)
    Path(env["RUBICK_STOP_FILE"]).write_text("now")
    assert job.stop_reason() == "agent"
    Path(env["RUBICK_STOP_FILE"]).unlink()
    podinfo.write_text(podinfo.read_text() + f'{contract.STOP_ANNOTATION}="1764072000.5"\n')
    assert job.stop_reason() == "agent", "the pod annotation, through the downward-API file"
    podinfo.write_text('rubick.io/stopper="no"\n')
    assert job.stop_reason() is None, "only the exact annotation key"


def test_sigterm_asks_for_a_checkpoint(tmp_path):
    _, env = launched(tmp_path)
    old = signal.getsignal(signal.SIGTERM)
    try:
        job = TrainingJob.from_env(env)
        os.kill(os.getpid(), signal.SIGTERM)
        assert job.stop_reason() == "sigterm"
    finally:
        signal.signal(signal.SIGTERM, old)
        contract._SIGTERM["seen"] = False


def test_code_started_without_a_launcher_says_so(tmp_path):
    with pytest.raises(RuntimeError, match="RUBICK_RUN_FILE is not set"):
        TrainingJob.from_env({}, catch_sigterm=False)


def test_the_example_workload_job_file_loads():
    job = load_job(REPO / "examples" / "workloads" / "hf-gpt2-job.yaml")
    assert job.workload.image and job.workload.command[-1].endswith("hf_gpt2.py")
    assert (REPO / job.workload.command[-1]).exists()
