"""Restart cost of a reconfiguration of the example model: checkpoint + relaunch + first iteration.

For each plan change and run: the trainer runs under the first plan; once it is past its first
iterations the stop is asked (as the agent does, through the stop file); it checkpoints and exits;
the trainer is launched under the second plan, resumes from the checkpoint, and the clock stops at
the end of its first iteration. Whatever stops the benchmark (an error, Ctrl-C, SIGTERM, SIGHUP, or a
kill -9, through the trainer's link to its parent), the trainers it started end with it. Prints each run and the median over runs of:

  checkpoint  stop asked -> checkpoint written        exit   checkpoint written -> processes gone
  relaunch    launch -> resumed and ready to train    first  the first iteration under the new plan
  total       stop asked -> first iteration done (what `job.reconfigured` reports as restart_cost_s)

and, once per change, the final evaluation loss of a 20-iteration run that changes plan at iteration 10
against the same run without the change (`dloss`: their absolute difference).

    python bench/reconfigure.py [--runs 3] [--size tiny] [--changes all]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.events import Plan, build  # noqa: E402
from controlplane.events.schema import to_plain  # noqa: E402
from examples.trainer.runner import kill_group, start, wait_for  # noqa: E402

CHANGES: dict[str, tuple[dict, dict]] = {
    "dp2-z2 -> dp1-z2-off-ga2": ({"dp": 2, "zero_stage": 2}, {"dp": 1, "zero_stage": 2, "offload": True, "ga_steps": 2}),
    "dp1-z0 -> dp2-z1": ({"dp": 1, "zero_stage": 0}, {"dp": 2, "zero_stage": 1}),
    "dp2-z1 -> dp2-z3-gc": ({"dp": 2, "zero_stage": 1}, {"dp": 2, "zero_stage": 3, "gc": True}),
    "dp2-z2 -> tp2-pp2": ({"dp": 2, "zero_stage": 2}, {"dp": 1, "tp": 2, "pp": 2, "micro_batches": 8}),
    "tp2-pp2 -> dp1-z2-off-ga2": ({"dp": 1, "tp": 2, "pp": 2, "micro_batches": 8},
                                  {"dp": 1, "zero_stage": 2, "offload": True, "ga_steps": 2}),
    "dp2-tp2 -> pp2": ({"dp": 2, "tp": 2}, {"dp": 1, "pp": 2, "micro_batches": 8}),
}
LOSS_ITERS = 20
PARTS = ("checkpoint", "exit", "relaunch", "first", "total")


def one_run(root: Path, before: Plan, after: Plan, size: str) -> dict[str, float]:
    procs = []
    try:
        return _measure(root, before, after, size, procs)
    finally:
        for proc in procs:  # nothing is left running, whatever happened (a worker may outlive torchrun)
            kill_group(proc)


def _measure(root: Path, before: Plan, after: Plan, size: str, procs: list) -> dict[str, float]:
    common = {"global_batch_size": 8, "target_iterations": 1_000_000, "size": size}
    proc = start(root, {**common, "plan": to_plain(before)}, nproc=before.gpus, attempt=1)
    procs.append(proc)
    wait_for(root, proc, lambda s: s.get("iteration", 0) >= s.get("started_iteration", 0) + 5)
    asked = time.time()
    (root / "control" / "stop").write_text(str(asked))
    st = wait_for(root, proc, lambda s: s.get("state") == "checkpointed")
    proc.wait(120)
    gone = time.time()
    launched = time.time()
    proc = start(root, {**common, "plan": to_plain(after)}, nproc=after.gpus, attempt=2)
    procs.append(proc)
    resumed = wait_for(root, proc, lambda s: bool(s.get("first_iteration_at")))
    (root / "control" / "stop").write_text(str(time.time()))
    proc.wait(120)
    return {"checkpoint": st["checkpointed_at"] - asked, "exit": gone - st["checkpointed_at"],
            "relaunch": resumed["launched_at"] - launched, "first": resumed["first_iteration_at"] - resumed["launched_at"],
            "total": resumed["first_iteration_at"] - asked}


def loss_difference(root: Path, before: Plan, after: Plan, size: str) -> float:
    """|final eval loss with the change at LOSS_ITERS / 2 - final eval loss without it|."""
    from examples.trainer.runner import run
    common = {"global_batch_size": 8, "target_iterations": LOSS_ITERS, "size": size, "seed": 0}
    straight = run(root / "straight", {**common, "plan": to_plain(before)}, nproc=before.gpus)
    run(root / "changed", {**common, "plan": to_plain(before), "stop_after": LOSS_ITERS // 2}, nproc=before.gpus)
    changed = run(root / "changed", {**common, "plan": to_plain(after)}, nproc=after.gpus, attempt=2)
    return abs(changed["eval_loss"] - straight["eval_loss"])


def _exit_on_signal(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)  # runs the clean-ups on the way out


def main() -> int:
    for sig in (signal.SIGTERM, signal.SIGHUP):  # a time limit or a closed terminal; Ctrl-C raises already
        signal.signal(sig, _exit_on_signal)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", default="tiny", help="example model size: tiny, small, medium")
    parser.add_argument("--changes", default="all", help=f"comma-separated among: {', '.join(CHANGES)}")
    args = parser.parse_args()
    names = list(CHANGES) if args.changes == "all" else [c.strip() for c in args.changes.split(",")]
    print(f"restart cost of the example model ({args.size}), seconds; {args.runs} runs per change")
    print(f"{'change':28s} {'run':>4s} " + " ".join(f"{p:>10s}" for p in PARTS))
    for name in names:
        before, after = (build(Plan, x) for x in CHANGES[name])
        rows = []
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="rubick-bench-") as tmp:
                row = one_run(Path(tmp), before, after, args.size)
            rows.append(row)
            print(f"{name:28s} {i + 1:>4d} " + " ".join(f"{row[p]:10.2f}" for p in PARTS), flush=True)
        with tempfile.TemporaryDirectory(prefix="rubick-bench-") as tmp:
            dloss = loss_difference(Path(tmp), before, after, args.size)
        print(f"{name:28s} {'med':>4s} " + " ".join(f"{statistics.median(r[p] for r in rows):10.2f}" for p in PARTS)
              + f"  dloss {dloss:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
