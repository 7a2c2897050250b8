"""The example trainer, run by torchrun (one process per device) from a run file:

    python -m agents.torchrun --nnodes=1 --nproc-per-node=2 --rdzv-backend=c10d \
        --rdzv-endpoint=127.0.0.1:0 --rdzv-id=JOB --local-addr=127.0.0.1 examples/trainer/train.py JOB_DIR/run.json

It follows the training contract (`agents.contract`, docs/workloads.md) like any workload: it trains
the small GPT of `model.py` on the sums of `data.py` under the run's plan, resumes from `checkpoint.pt`
in the checkpoint folder when there is one (written under any plan), and reports every iteration
through the reporter. Data-parallel plans (DP = world size, ZeRO 0-3, ZeRO-Offload, GA, GC) run under
DeepSpeed; plans with tensor or pipeline parallelism (TP x PP x DP, GA, GC, micro-batches) run on
torch's own modules (`parallel.py`). Between iterations it asks the
contract whether to stop (the agent asked, SIGTERM, the agent's lease ran out, or the run file's
`stop_after` iterations are done): then it checkpoints and exits 0 (state `checkpointed`, `stopped_by`
saying why). Rank 0 keeps the status file current (state, iterations done, loss, first-iteration
time). Started by hand with a run file (`examples.trainer.runner`), the files are the job folder's.

`min_iteration_s` in the run file (`rubick agent --min-iteration-s`; default 0) is the least wall time an iteration
takes: what its work leaves of it is slept after the iteration, outside the time the reporter measures. On CPU devices
the example trainer otherwise keeps every core it is given busy for as long as it runs, where a job on a GPU leaves
the host's cores mostly idle; a floor keeps a long demonstration or test job from taking the machine.
"""

from __future__ import annotations

import argparse
import logging
import math
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

from agents.contract import DEEPSPEED_CONFIG, TrainingJob  # noqa: E402
from agents.plan_config import deepspeed_config  # noqa: E402
from agents import checkpoint  # noqa: E402
from controlplane.lifetime import exit_at_once  # noqa: E402
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


def iteration_floor(run: dict) -> float:
    """The run file's `min_iteration_s` (0 when absent): a finite number of seconds, 0 or more; anything else ends the
    run with the reason."""
    raw = run.get("min_iteration_s")
    if raw is None:
        return 0.0
    try:
        floor = float(raw)
    except (TypeError, ValueError):
        floor = math.nan
    if isinstance(raw, bool) or not (math.isfinite(floor) and floor >= 0):
        raise SystemExit(f"min_iteration_s = {raw!r} in the run file: give a number of seconds, 0 or more")
    return floor


def rest(began: float, floor: float) -> None:
    """Sleep what is left of an iteration begun at `began` (`time.monotonic()`) under a floor of `floor` seconds."""
    if floor > 0:
        left = floor - (time.monotonic() - began)
        if left > 0:
            time.sleep(left)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="run file written by the agent's launcher")
    args = parser.parse_args(argv)
    job = TrainingJob.from_env(run_file=args.run)
    try:
        return train(job)
    except SystemExit as exc:
        if isinstance(exc.code, str):  # a reason: the launcher reports it
            job.failed(exc.code)
        raise


def train(job: TrainingJob) -> int:
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
    floor = iteration_floor(run)
    (job_dir / "pids").mkdir(parents=True, exist_ok=True)
    (job_dir / "pids" / f"rank-{rank}").write_text(str(os.getpid()))
    torch.set_num_threads(max(1, int(run.get("cpus_per_gpu") or 1)))

    seed, gbs, target = int(run.get("seed", 0)), int(run["global_batch_size"]), int(run["target_iterations"])
    data = SumsDataset(seq_len=int(run.get("seq_len", 32)))
    model = build_model(run.get("size", "tiny"), data.vocab_size, data.seq_len, seed, plan.gc)
    ckpt_path = job.checkpoint_dir / CHECKPOINT
    saved = read_checkpoint(ckpt_path, job.run.get("model_type"))
    if plan.tp > 1 or plan.pp > 1:
        return train_3d(job, model, data, saved, ckpt_path, floor)
    if saved is not None:
        unusable(lambda: checkpoint.load_weights(saved, model), ckpt_path)
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
        began = time.monotonic()
        stopped_by = stop_requested(job) or ("stop_after" if stop_after is not None and it >= int(stop_after)
                                                 else None)
        if stopped_by:
            checkpoint.save(ckpt_path, engine, model, {"iteration": it, "plan": plan.code(),
                                                       "model_type": run.get("model_type")})
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
            checkpoint.save(ckpt_path, engine, model, {"iteration": it, "plan": plan.code(),
                                                       "model_type": run.get("model_type")})
        job.iteration_done(it, loss=micro_loss)
        rest(began, floor)
    else:
        engine.eval()
        with torch.no_grad():
            eval_loss = float(engine(*(t.to(engine.device) for t in data.eval_batch())))
        job.completed(it, eval_loss=eval_loss)
    reporter.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def read_checkpoint(path: Path, model_type: str | None) -> dict | None:
    """The checkpoint to resume from (None: start afresh); one that cannot be read, or is another model
    type's, ends the run with the reason (never a silent restart from scratch)."""
    if not path.exists():
        return None
    try:
        saved = checkpoint.read(path)
    except Exception as exc:  # noqa: BLE001 - torch.load raises many kinds for a torn or foreign file
        raise SystemExit(f"cannot read the checkpoint {path}: {exc}") from None
    if not isinstance(saved, dict) or "params" not in saved or "iteration" not in saved:
        raise SystemExit(f"{path} is not a checkpoint of this trainer")
    if model_type and saved.get("model_type", model_type) != model_type:
        raise SystemExit(f"{path} is a checkpoint of model type {saved['model_type']}, not {model_type}")
    return saved


def unusable(load, path: Path) -> None:
    """Load a checkpoint; one that does not fit the model (another size or architecture) ends the run with
    the reason, on every rank alike (each checks the same file), so no rank waits for the others."""
    try:
        load()
    except RuntimeError as exc:
        raise SystemExit(f"cannot resume from {path}: {exc}") from None


def train_3d(job: TrainingJob, model, data: SumsDataset, saved: dict | None, ckpt_path: Path,
             floor: float) -> int:
    """A plan with tensor or pipeline parallelism (`parallel.py`), under the same contract. `parallel` is imported
    here: torch's tensor and pipeline modules take seconds to import (torch._dynamo among them), which a
    data-parallel plan would pay at every start for nothing. `floor`: the run file's `min_iteration_s`, as `train` read
    it (`iteration_floor`)."""
    from examples.trainer import parallel

    run, plan = job.run, job.plan
    seed, gbs, target = int(run.get("seed", 0)), int(run["global_batch_size"]), int(run["target_iterations"])
    try:
        par = parallel.build(plan, model, gbs, lr=float(run.get("lr", 3e-3)))
    except parallel.PlanUnsupported as exc:
        raise SystemExit(f"plan {plan.code()} cannot run: {exc}") from None
    start = 0
    if saved is not None:
        unusable(lambda: checkpoint.load_owned(saved, par.params, par.optimizer), ckpt_path)
        start = int(saved["iteration"])
        del saved
    meta = {"plan": plan.code(), "model_type": run.get("model_type")}
    reporter = job.reporter()
    job.begin(start, loss=None)
    every = int(run.get("checkpoint_every", 0))
    stop_after = run.get("stop_after")
    it = start
    while it < target:
        began = time.monotonic()
        stopped_by = stop_requested(job) or ("stop_after" if stop_after is not None and it >= int(stop_after)
                                                 else None)
        if stopped_by:
            checkpoint.save_owned(ckpt_path, par.params, par.optimizer, par.contributes, {"iteration": it, **meta})
            job.checkpointed(it, stopped_by)
            break
        batches = [data.micro_batch(it, gbs, seed, par.dp_rank, plan.dp, g, plan.ga_steps)
                   for g in range(plan.ga_steps)]
        with reporter.step(it):
            loss = parallel.train_step(par, batches, reporter)
        it += 1
        if every and it % every == 0 and it < target:
            checkpoint.save_owned(ckpt_path, par.params, par.optimizer, par.contributes, {"iteration": it, **meta})
        job.iteration_done(it, loss=loss)
        rest(began, floor)
    else:
        whole = checkpoint.collect_owned(par.params, par.optimizer, par.contributes)
        if whole is not None:  # rank 0: the whole model, evaluated as the DeepSpeed path does
            full = build_model(run.get("size", "tiny"), data.vocab_size, data.seq_len, seed, False)
            checkpoint.load_weights(whole, full)
            full.eval()
            with torch.no_grad():
                eval_loss = float(full(*data.eval_batch()))
            job.completed(it, eval_loss=eval_loss)
    reporter.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()  # an error or a refusal ends the run the usual way; a run that returned has nothing left to do
    exit_at_once(code)
