"""The example trainer, run by torchrun (one process per device) from a run file:

    python -m agents.torchrun --nnodes=1 --nproc-per-node=2 --rdzv-backend=c10d \
        --rdzv-endpoint=127.0.0.1:0 --rdzv-id=JOB --local-addr=127.0.0.1 examples/trainer/train.py JOB_DIR/run.json

It follows the training contract (`agents.contract`, docs/workloads.md) like any workload: it trains
the small GPT of `model.py` on the sums of `data.py` under the run's plan (DP size = world size, ZeRO
0-3, ZeRO-Offload, GA, GC) with DeepSpeed, resumes from `checkpoint.pt` in the checkpoint folder
when there is one, and reports every iteration through the reporter. Between iterations it asks the
contract whether to stop (the agent asked, SIGTERM, the agent's lease ran out, or the run file's
`stop_after` iterations are done): then it checkpoints and exits 0 (state `checkpointed`, `stopped_by`
saying why). Rank 0 keeps the status file current (state, iterations done, loss, first-iteration
time). Started by hand with a run file (`examples.trainer.runner`), the files are the job folder's.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from agents.contract import DEEPSPEED_CONFIG, TrainingJob  # noqa: E402
from agents.plan_config import deepspeed_config  # noqa: E402
from agents import checkpoint  # noqa: E402
from examples.trainer.data import SumsDataset  # noqa: E402
from examples.trainer.model import build_model  # noqa: E402

CHECKPOINT = "checkpoint.pt"

STOPPED_BY = ("", "lease expired", "agent", "sigterm")


def stop_requested(job: TrainingJob) -> str | None:
    """Every rank asks the contract and all agree (so all stop at the same iteration): why to stop
    ("agent", "sigterm", "lease expired"), or None."""
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    why = job.stop_reason()
    flag = torch.tensor([STOPPED_BY.index(why) if why in STOPPED_BY else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return STOPPED_BY[int(flag.item())] or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="run file written by the agent's launcher")
    args = parser.parse_args(argv)
    job = TrainingJob.from_env(run_file=args.run)
    run = job.run
    job_dir = Path(run["job_dir"])
    plan = job.plan
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)

    gpu = torch.cuda.is_available()
    deepspeed.init_distributed(dist_backend="nccl" if gpu else "gloo")
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    rank, world = dist.get_rank(), dist.get_world_size()
    job.rank = rank
    if world != plan.gpus:
        raise SystemExit(f"world size {world} differs from the plan's dp*tp*pp = {plan.gpus}")
    if plan.tp > 1 or plan.pp > 1:
        raise SystemExit("the example trainer runs data parallelism only (tp = pp = 1)")
    (job_dir / "pids").mkdir(parents=True, exist_ok=True)
    (job_dir / "pids" / f"rank-{rank}").write_text(str(os.getpid()))
    torch.set_num_threads(max(1, int(run.get("cpus_per_gpu") or 1)))

    seed, gbs, target = int(run.get("seed", 0)), int(run["global_batch_size"]), int(run["target_iterations"])
    data = SumsDataset(seq_len=int(run.get("seq_len", 32)))
    model = build_model(run.get("size", "tiny"), data.vocab_size, data.seq_len, seed, plan.gc)
    ckpt_path = job.checkpoint_dir / CHECKPOINT
    saved = checkpoint.read(ckpt_path) if ckpt_path.exists() else None
    if saved is not None:
        checkpoint.load_weights(saved, model)
    config = (job.deepspeed_config() if DEEPSPEED_CONFIG in job.env
              else deepspeed_config(plan, gbs, lr=float(run.get("lr", 3e-3))))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    start = 0
    if saved is not None:
        checkpoint.load_optimizer(saved, engine, model)
        start = int(saved["iteration"])
        del saved

    reporter = job.reporter()
    timed = reporter.timed(engine, start)
    job.begin(start, loss=None)
    every = int(run.get("checkpoint_every", 0))
    dp_rank, micro_loss = rank, 0.0
    it = start
    stop_after = run.get("stop_after")  # checkpoint and exit after this many iterations, as if asked to
    while it < target:
        stopped_by = stop_requested(job) or ("stop_after" if stop_after is not None and it >= int(stop_after)
                                                 else None)
        if stopped_by:
            checkpoint.save(ckpt_path, engine, model, {"iteration": it, "plan": plan.code()})
            job.checkpointed(it, stopped_by)
            break
        engine.train()
        micro_loss = 0.0
        for g in range(plan.ga_steps):
            x, y = data.micro_batch(it, gbs, seed, dp_rank, plan.dp, g, plan.ga_steps)
            loss = timed(x.to(engine.device), y.to(engine.device))
            timed.backward(loss)
            timed.step()
            micro_loss += float(loss.detach()) / plan.ga_steps
        it += 1
        if every and it % every == 0 and it < target:
            checkpoint.save(ckpt_path, engine, model, {"iteration": it, "plan": plan.code()})
        job.iteration_done(it, loss=micro_loss)
    else:
        engine.eval()
        with torch.no_grad():
            eval_loss = float(engine(*(t.to(engine.device) for t in data.eval_batch())))
        job.completed(it, eval_loss=eval_loss)
    reporter.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
