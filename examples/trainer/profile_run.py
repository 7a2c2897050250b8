"""Measure several plans of one data-parallel size in one torchrun launch (for `rubick profile`).

    torchrun --standalone --nproc-per-node=N examples/trainer/profile_run.py RUN_FILE

The run file gives the architecture (`arch`: hidden, layers, heads, seq_len, vocab_size), the
global batch, the `plans` (all on N devices: dp * tp * pp = N), `warmup` and `iterations`. For each
plan a fresh model is built, with a DeepSpeed engine for a data-parallel plan or split by the
trainer's tensor and pipeline parallelism (`parallel.py`) for a 3D one; `warmup` iterations run
untimed, then `iterations` timed ones are published through the reporter; rank 0 writes the
medians to `<job_dir>/profile.json`.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from agents import jit_ops  # noqa: E402
from agents.plan_config import deepspeed_config  # noqa: E402
from agents.reporter import Reporter  # noqa: E402
from controlplane.events import Plan, build  # noqa: E402
from controlplane.events.schema import to_plain  # noqa: E402
from controlplane.lifetime import exit_at_once  # noqa: E402
from examples.trainer.data import SumsDataset  # noqa: E402
from examples.trainer.model import GPTConfig, TinyGPT  # noqa: E402


def measure_3d(run: dict, plan: Plan, model: TinyGPT, data: SumsDataset, rank: int, attempt: int) -> dict:
    from examples.trainer import parallel  # only 3D plans need it, and it takes seconds to import

    gbs = int(run["global_batch_size"])
    par = parallel.build(plan, model, gbs, lr=3e-3)
    reporter = Reporter.from_run({**run, "plan": to_plain(plan), "attempt": attempt,
                                  "nats_url": run.get("nats_url") if rank == 0 else None})
    rows = []
    warmup, iterations = int(run.get("warmup", 2)), int(run.get("iterations", 5))
    for it in range(warmup + iterations):
        batches = [data.micro_batch(it, gbs, 0, par.dp_rank, plan.dp, g, plan.ga_steps) for g in range(plan.ga_steps)]
        if it < warmup:
            parallel.train_step(par, batches)
            continue
        with reporter.step(it - warmup):
            parallel.train_step(par, batches, reporter)
        rows.append(dict(reporter.last))
    reporter.close()
    unsent = reporter.pending + reporter.dropped
    del par, model
    gc.collect()
    dist.barrier()
    # a pipeline interleaves forward and backward: its forward time alone is not measured (None)
    return {"plan": plan.code(), "unsent": unsent,
            **{k: (statistics.median(r[k] for r in rows) if rows[0][k] is not None else None) for k in rows[0]}}


def measure(run: dict, plan: Plan, data: SumsDataset, rank: int, attempt: int) -> dict:
    arch = run["arch"]
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(vocab_size=max(arch["vocab_size"], data.vocab_size), seq_len=arch["seq_len"],
                              hidden=arch["hidden"], layers=arch["layers"], heads=arch["heads"]), plan.gc)
    if plan.tp > 1 or plan.pp > 1:
        return measure_3d(run, plan, model, data, rank, attempt)
    gbs = int(run["global_batch_size"])
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=deepspeed_config(plan, gbs))
    reporter = Reporter.from_run({**run, "plan": to_plain(plan), "attempt": attempt,
                                  "nats_url": run.get("nats_url") if rank == 0 else None})
    timed = reporter.timed(engine, 0)
    rows = []
    warmup, iterations = int(run.get("warmup", 2)), int(run.get("iterations", 5))
    for it in range(warmup + iterations):
        step = timed if it >= warmup else engine
        for g in range(plan.ga_steps):
            x, y = data.micro_batch(it, gbs, 0, rank, plan.dp, g, plan.ga_steps)
            loss = step(x, y)
            step.backward(loss)
            step.step()
        if it >= warmup:
            rows.append(dict(reporter.last))
    reporter.close()
    unsent = reporter.pending + reporter.dropped
    if hasattr(engine, "destroy"):
        engine.destroy()
    del engine, model
    gc.collect()
    dist.barrier()
    return {"plan": plan.code(), "unsent": unsent, **{k: statistics.median(r[k] for r in rows) for k in rows[0]}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    run = json.loads(parser.parse_args().run.read_text())
    jit_ops.guard_builds()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    torch.set_num_threads(max(1, int(run.get("cpus_per_gpu") or 1)))
    data = SumsDataset(seq_len=int(run["arch"]["seq_len"]))
    results = []
    for i, doc in enumerate(run["plans"]):
        plan = build(Plan, doc)
        results.append(measure(run, plan, data, rank, attempt=100 * int(run.get("launch", 0)) + i + 1))
    if rank == 0:
        (Path(run["job_dir"]) / "profile.json").write_text(json.dumps(results, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()  # an error ends the run the usual way; a run that returned has written its profile
    exit_at_once(code)
