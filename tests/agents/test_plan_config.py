"""Plan -> DeepSpeed configuration and torchrun arguments."""

from __future__ import annotations

import pytest

from agents.plan_config import PlanError, deepspeed_config, torchrun_args
from controlplane.events import NodeShare, Plan


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_stage_and_the_global_batch_kept(stage):
    cfg = deepspeed_config(Plan(dp=2, zero_stage=stage, ga_steps=2), 16)
    assert cfg["zero_optimization"] == {"stage": stage}
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) \
        == (16, 4, 2)
    assert cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * 2 == cfg["train_batch_size"]


def test_offload_and_activation_checkpointing():
    cfg = deepspeed_config(Plan(dp=1, zero_stage=2, offload=True, gc=True), 8)
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "activation_checkpointing" in cfg
    assert cfg["optimizer"]["params"]["torch_adam"] is True and cfg["zero_force_ds_cpu_optimizer"] is False
    assert "activation_checkpointing" not in deepspeed_config(Plan(), 8)


def test_plans_that_cannot_be_configured():
    with pytest.raises(PlanError, match="not divisible"):
        deepspeed_config(Plan(dp=3), 8)
    with pytest.raises(PlanError, match="Offload"):
        deepspeed_config(_offload_without_zero(), 8)


def _offload_without_zero() -> Plan:
    plan = Plan()
    object.__setattr__(plan, "offload", True)  # the schema refuses it; the config refuses it too
    return plan


def test_torchrun_one_node_and_several():
    one = (NodeShare(node="a", gpus=4),)
    assert torchrun_args("j", one, "a") == ["--nnodes=1", "--nproc-per-node=4", "--rdzv-backend=c10d",
                                            "--rdzv-endpoint=127.0.0.1:0", "--rdzv-id=j", "--local-addr=127.0.0.1"]
    two = (NodeShare(node="a", gpus=2), NodeShare(node="b", gpus=2))
    args = torchrun_args("j", two, "b", rdzv_port=29555)
    assert "--nnodes=2" in args and "--node-rank=1" in args and "--rdzv-endpoint=a:29555" in args
    with pytest.raises(PlanError, match="same number"):
        torchrun_args("j", (NodeShare(node="a", gpus=2), NodeShare(node="b", gpus=1)), "a")
    with pytest.raises(PlanError, match="no devices"):
        torchrun_args("j", one, "c")
