"""An execution plan as a DeepSpeed configuration and as torchrun arguments (pure functions).

`deepspeed_config` honours every plan field DeepSpeed owns: ZeRO stage 0-3, ZeRO-Offload
(`offload_optimizer` to the CPU), gradient accumulation and the micro-batch size that keeps
the global batch fixed, plus activation checkpointing. TP and PP are the model code's
business (Megatron-DeepSpeed), so they appear only in the world size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from controlplane.events import NodeShare, Plan


class PlanError(ValueError):
    """A plan that cannot be turned into a launch."""


def micro_batch_size(plan: Plan, global_batch_size: int) -> int:
    per_step = plan.dp * plan.ga_steps
    if global_batch_size % per_step:
        raise PlanError(f"global batch {global_batch_size} is not divisible by dp*ga_steps = {per_step}")
    return global_batch_size // per_step


def deepspeed_config(plan: Plan, global_batch_size: int, *, lr: float = 3e-3, weight_decay: float = 0.0,
                     gradient_clipping: float = 1.0, torch_adam: bool = True) -> dict[str, Any]:
    """The DeepSpeed JSON configuration of a plan (fp32 training, AdamW)."""
    zero: dict[str, Any] = {"stage": plan.zero_stage}
    if plan.offload:
        if plan.zero_stage == 0:
            raise PlanError("ZeRO-Offload needs a ZeRO stage of 1 or more")
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    config: dict[str, Any] = {
        "train_batch_size": global_batch_size,
        "train_micro_batch_size_per_gpu": micro_batch_size(plan, global_batch_size),
        "gradient_accumulation_steps": plan.ga_steps,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": weight_decay, "torch_adam": torch_adam}},
        "zero_optimization": zero,
        # torch's AdamW also runs on offloaded (CPU) optimizer states; DeepSpeedCPUAdam is faster on GPU
        # nodes but must be compiled first.
        "zero_force_ds_cpu_optimizer": not torch_adam,
        "gradient_clipping": gradient_clipping,
        "steps_per_print": 1_000_000_000,
        "wall_clock_breakdown": False,
    }
    if plan.gc:
        config["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": False,
                                              "contiguous_memory_optimization": False}
    return config


def torchrun_args(job_id: str, allocation: Sequence[NodeShare], node: str, *, rdzv_host: str | None = None,
                  rdzv_port: int = 29400) -> list[str]:
    """torchrun arguments for this node's share of a job (one process per device).

    One node: a private c10d rendezvous on a free port of 127.0.0.1 (run them with `agents.torchrun`,
    which keeps its stores on the loopback interface). Several nodes: every node runs the same number
    of processes and meets at the first node's c10d rendezvous.
    """
    nodes = [s.node for s in allocation if s.gpus > 0]
    if node not in nodes:
        raise PlanError(f"node {node} has no devices in the allocation")
    share = next(s for s in allocation if s.node == node)
    if len(nodes) == 1:
        return loopback_args(job_id, share.gpus)
    counts = {s.gpus for s in allocation if s.gpus > 0}
    if len(counts) != 1:
        raise PlanError("torchrun needs the same number of devices on every node of a job")
    host = rdzv_host or nodes[0]
    return [f"--nnodes={len(nodes)}", f"--nproc-per-node={share.gpus}", f"--node-rank={nodes.index(node)}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={host}:{rdzv_port}", f"--rdzv-id={job_id}"]


def loopback_args(run_id: str, nproc: int) -> list[str]:
    """torchrun arguments of a job on this node only: everything on 127.0.0.1."""
    return ["--nnodes=1", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0",
            f"--rdzv-id={run_id}", "--local-addr=127.0.0.1"]


TRAINER_DIR = Path(__file__).resolve().parent.parent / "examples" / "trainer"
WARM_SCRIPTS = {"train.py": "examples.trainer.train", "profile_run.py": "examples.trainer.profile_run"}
"""The project's trainer scripts (in `examples/trainer/`) that start warm, and their modules."""


def warm_modules(script: str | Path) -> tuple[str, ...]:
    """What a warm start of `script` imports before forking its processes (empty: `script` starts cold): one of the
    project's trainer scripts as a module (its imports: torch, DeepSpeed, the project's modules; its `main` runs only
    in the workers), and what torch imports at an optimizer's first step (`torch._dynamo`, seconds of CPU: its first
    use is behind `torch._disable_dynamo`). Any other script (a user's own) is never run in a fork."""
    path = Path(script).resolve()
    module = WARM_SCRIPTS.get(path.name)
    if module is None or path != TRAINER_DIR / path.name:
        return ()
    return (module, "torch._dynamo")


def trainer_command(python: str, targs: Sequence[str], script: str, args: Sequence[str], *,
                    warm: bool) -> list[str]:
    """The command that runs `script args` under `agents.torchrun` with torchrun arguments `targs`. `warm` (for a
    process that does not use CUDA only), where `script` is one of the project's trainer scripts (`warm_modules`): its
    processes are forked from torchrun once it imported those modules (torchrun's `--start-method=fork --run-path`,
    see `agents.torchrun`)."""
    modules = warm_modules(script) if warm else ()
    if not modules:
        return [python, "-m", "agents.torchrun", *targs, script, *args]
    return [python, "-m", "agents.torchrun", f"--preload={','.join(modules)}", *targs, "--start-method=fork",
            "--run-path", str(Path(script).resolve()), *args]  # torchrun's --run-path takes an absolute path


def torchrun_env(allocation: Sequence[NodeShare]) -> dict[str, str]:
    """Environment of a job's training processes: a job on one node keeps its sockets on the loopback
    interface (gloo's and NCCL's own listeners; the rendezvous stores are `agents.torchrun`'s part)."""
    if len([s for s in allocation if s.gpus > 0]) == 1:
        return {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    return {}
