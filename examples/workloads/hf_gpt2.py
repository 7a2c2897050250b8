"""A user's own training script under the training contract (docs/workloads.md).

A Hugging Face GPT-2 (a small configuration, randomly initialised: nothing is downloaded) trained with
DeepSpeed on whatever plan the scheduler decided. Everything the script needs from the control plane
comes from `agents.contract.TrainingJob`: the plan and batch sizes, the generated DeepSpeed
configuration, the checkpoint folder, whether to stop, and the status to leave. Iterations are
reported with `agents.reporter`. `agents.checkpoint` writes a checkpoint any later plan can resume
from (another DP size, ZeRO stage, offload or GA split).

Submit it with a workload (examples/workloads/hf-gpt2-job.yaml):

    workload:
      command: [python, examples/workloads/hf_gpt2.py]
      working_dir: /path/to/this/repo
      checkpoint: {host_path: /var/lib/rubick/ckpt/hf-gpt2}
"""

from __future__ import annotations

import logging
import os
import sys

import deepspeed
import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel

from agents import checkpoint
from agents.contract import TrainingJob

VOCAB, SEQ = 128, 32


def global_batch(iteration: int, size: int) -> torch.Tensor:
    """The iteration's whole batch, the same under every plan: arithmetic sequences modulo VOCAB."""
    g = torch.Generator().manual_seed(iteration)
    start = torch.randint(0, VOCAB, (size, 1), generator=g)
    step = torch.randint(1, 8, (size, 1), generator=g)
    return (start + step * torch.arange(SEQ)) % VOCAB


def agreed_stop(job: TrainingJob) -> str | None:
    """Every rank stops at the same iteration: the reasons are all-reduced."""
    reasons = ("", "lease expired", "agent", "sigterm")
    mine = job.stop_reason()
    flag = torch.tensor([reasons.index(mine) if mine in reasons else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return reasons[int(flag.item())] or None


def main() -> int:
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    job = TrainingJob.from_env()
    deepspeed.init_distributed(dist_backend="gloo")
    job.rank, dp = dist.get_rank(), dist.get_world_size()
    plan = job.plan
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
                                       bos_token_id=0, eos_token_id=0, use_cache=False))
    if plan.gc:
        model.gradient_checkpointing_enable()
    path = job.checkpoint_dir / "checkpoint.pt"
    saved = checkpoint.read(path) if path.exists() else None
    if saved is not None:
        checkpoint.load_weights(saved, model)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=job.deepspeed_config())
    start = 0
    if saved is not None:
        checkpoint.load_optimizer(saved, engine, model)
        start = int(saved["iteration"])
    reporter = job.reporter()
    timed = reporter.timed(engine, start)
    job.begin(start)
    mbs, ga = job.micro_batch_size, plan.ga_steps
    loss_value = None
    for it in range(start, job.target_iterations):
        why = agreed_stop(job)
        if why:
            checkpoint.save(path, engine, model, {"iteration": it})
            job.checkpointed(it, why)
            break
        batch = global_batch(it, job.global_batch_size)
        engine.train()
        total = 0.0
        for g in range(ga):
            rows = batch[(g * dp + job.rank) * mbs:(g * dp + job.rank + 1) * mbs]
            out = timed(input_ids=rows, labels=rows)
            timed.backward(out.loss)
            timed.step()
            total += float(out.loss.detach()) / ga
        loss_value = total
        job.iteration_done(it + 1, loss=loss_value)
    else:
        job.completed(job.target_iterations, loss=loss_value)
    reporter.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
