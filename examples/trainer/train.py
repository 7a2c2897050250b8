"""The example trainer, run by torchrun (one process per device) from a run file:

    python -m agents.torchrun --nnodes=1 --nproc-per-node=2 --rdzv-backend=c10d \
        --rdzv-endpoint=127.0.0.1:0 --rdzv-id=JOB --local-addr=127.0.0.1 examples/trainer/train.py JOB_DIR/run.json

It trains the small GPT of `model.py` on the sums of `data.py` under the run's plan
(DP size = world size, ZeRO 0-3, ZeRO-Offload, GA, GC) with DeepSpeed, resumes from
`JOB_DIR/checkpoint.pt` when there is one, and reports every iteration through the
reporter. Between iterations it looks for `JOB_DIR/control/stop`: when the agent puts
it there (or after the run file's `stop_after` iterations), or when the agent's lease on the job
has run out (`agents.lease`: no agent has looked after it for `RUBICK_AGENT_LEASE_S` seconds), the
trainer checkpoints and exits 0 (state `checkpointed`, `stopped_by` saying why). Rank 0 keeps
`JOB_DIR/status.json` current (state, iterations done, loss, first-iteration time).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from agents.lease import lease_expired  # noqa: E402
from agents.plan_config import deepspeed_config  # noqa: E402
from agents.reporter import Reporter  # noqa: E402
from controlplane.events import Plan, build  # noqa: E402
from examples.trainer import checkpoint  # noqa: E402
from examples.trainer.data import SumsDataset  # noqa: E402
from examples.trainer.model import build_model  # noqa: E402

CHECKPOINT = "checkpoint.pt"
STATUS = "status.json"
STOP = "control/stop"


def write_status(job_dir: Path, doc: dict) -> None:
    tmp = job_dir / (STATUS + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, job_dir / STATUS)


STOPPED_BY = {1: "lease expired", 2: "agent"}


def stop_requested(job_dir: Path) -> str | None:
    """Rank 0 looks for the stop file and at the agent's lease; every rank gets its answer (so all stop
    at the same iteration): why to stop ("agent", "lease expired"), or None."""
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    why = 0
    if dist.get_rank() == 0:
        why = 2 if (job_dir / STOP).exists() else 1 if lease_expired(job_dir) else 0
    flag = torch.tensor([why], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return STOPPED_BY.get(int(flag.item()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="run file written by the agent's launcher")
    args = parser.parse_args(argv)
    run = json.loads(args.run.read_text())
    job_dir = Path(run["job_dir"])
    plan = build(Plan, run["plan"])
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)

    gpu = torch.cuda.is_available()
    deepspeed.init_distributed(dist_backend="nccl" if gpu else "gloo")
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    rank, world = dist.get_rank(), dist.get_world_size()
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
    ckpt_path = job_dir / CHECKPOINT
    saved = checkpoint.read(ckpt_path) if ckpt_path.exists() else None
    if saved is not None:
        checkpoint.load_weights(saved, model)
    config = deepspeed_config(plan, gbs, lr=float(run.get("lr", 3e-3)))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    start = 0
    if saved is not None:
        checkpoint.load_optimizer(saved, engine, model)
        start = int(saved["iteration"])
        del saved

    reporter = Reporter.from_run(run if rank == 0 else {**run, "nats_url": None})
    timed = reporter.timed(engine, start)
    status = {"state": "running", "attempt": run.get("attempt", 1), "plan": plan.code(), "iteration": start,
              "target": target, "started_iteration": start, "launched_at": time.time(),
              "first_iteration_at": None, "loss": None}
    if rank == 0:
        write_status(job_dir, status)
    every = int(run.get("checkpoint_every", 0))
    dp_rank, micro_loss = rank, 0.0
    it = start
    stop_after = run.get("stop_after")  # checkpoint and exit after this many iterations, as if asked to
    while it < target:
        stopped_by = stop_requested(job_dir) or ("stop_after" if stop_after is not None and it >= int(stop_after)
                                                 else None)
        if stopped_by:
            checkpoint.save(ckpt_path, engine, model, {"iteration": it, "plan": plan.code()})
            if rank == 0:
                write_status(job_dir, {**status, "state": "checkpointed", "iteration": it,
                                       "checkpointed_at": time.time(), "stopped_by": stopped_by})
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
        if rank == 0:
            now = time.time()
            status.update(iteration=it, loss=micro_loss, updated_at=now,
                          first_iteration_at=status["first_iteration_at"] or now)
            write_status(job_dir, status)
    else:
        engine.eval()
        with torch.no_grad():
            eval_loss = float(engine(*(t.to(engine.device) for t in data.eval_batch())))
        if rank == 0:
            write_status(job_dir, {**status, "state": "completed", "iteration": it, "eval_loss": eval_loss,
                                   "completed_at": time.time()})
    reporter.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
