"""Accuracy across reconfigurations (the method of Table 3 of the paper, with a tighter bound): a run that changes
plan four times, from DP=2 with ZeRO-2 to DP=1 with ZeRO-Offload and GA=2 (DeepSpeed to DeepSpeed), then to TP x PP
(torch's tensor and pipeline parallel modules), PP alone and DP=1 with ZeRO-Offload and GA=4 (DeepSpeed again),
each time through the plan-independent checkpoint, ends with the evaluation loss of an uninterrupted run of the
same seed, and not with that of another seed.

The tolerance: both runs do the same arithmetic on the same samples except for the order of floating-point
reductions (a data-parallel all-reduce sums partial gradients, tensor parallelism two partial products,
a pipeline and gradient accumulation sum micro-batch gradients one by one). fp32 rounding of a different order
changes the last bits of a gradient and Adam carries it through every later step, so equality is not guaranteed
bit for bit; on this model the final losses agree to float32 precision (a difference of 0 to about 1e-7). The
test allows 1e-5 (relative), and requires another seed to move the loss at least ten times that (it moves it
~2e-3): a plan change moves the loss far less than a seed does, which is the paper's criterion."""

from __future__ import annotations

import math
import re
import sys

import pytest

from examples.trainer.data import ALPHABET
from examples.trainer.forks import Forks
from examples.trainer.runner import launch_env, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

N = 16
COMMON = {"global_batch_size": 8, "target_iterations": N, "size": "small"}  # 4 layers, 4 heads
STEPS = [  # (plan, processes, iterations it runs to)
    ({"dp": 2, "zero_stage": 2}, 2, 3),
    ({"dp": 1, "zero_stage": 2, "offload": True, "ga_steps": 2}, 1, 6),
    ({"dp": 1, "tp": 2, "pp": 2, "micro_batches": 4}, 4, 10),
    ({"dp": 1, "pp": 4, "micro_batches": 8}, 4, 13),
    ({"dp": 1, "zero_stage": 2, "offload": True, "ga_steps": 4}, 1, N),
]
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def forks():
    """One warm process to fork launches from (`examples.trainer.forks`): each then skips torchrun's imports, seconds
    of CPU a launch."""
    with Forks(launch_env()) as warm:
        yield warm


def test_four_plan_changes_through_offload_and_tp_pp_end_with_the_uninterrupted_loss(tmp_path, forks):
    """The uninterrupted run is launched the runner's usual way (torchrun started afresh), the others forked from
    the warm process: the two ways train the same (the losses agree), and another seed does not."""
    from controlplane.events import Plan
    from controlplane.events.schema import build

    straight = run(tmp_path / "straight", {**COMMON, "plan": {"dp": 1}, "seed": 0}, nproc=1)
    job = tmp_path / "changed"
    for attempt, (plan, nproc, until) in enumerate(STEPS, start=1):
        extra = {} if until == N else {"stop_after": until}
        st = run(job, {**COMMON, "plan": plan, "seed": 0, **extra}, nproc=nproc, attempt=attempt, forks=forks)
        assert st["started_iteration"] == (STEPS[attempt - 2][2] if attempt > 1 else 0)
        assert st["iteration"] == until and st["state"] == ("completed" if until == N else "checkpointed")
        assert st["plan"] == build(Plan, plan).code(), "the run trained under another plan than the one asked"
    changed = st
    # another seed, on one process: a plan changes only the order of the sums (~1e-7), a seed the loss (~2e-3)
    other_seed = run(tmp_path / "seed", {**COMMON, "plan": {"dp": 1}, "seed": 1}, nproc=1, forks=forks)

    base = straight["eval_loss"]
    assert base < math.log(len(ALPHABET)), "the model did not learn anything"
    by_reconfiguration = abs(changed["eval_loss"] - base)
    by_seed = abs(other_seed["eval_loss"] - base)
    print(f"\nfinal eval loss after {N} iterations: {base:.7f} | through DP2-ZeRO2 -> DP1-offload-GA2 -> TP2xPP2 -> "
          f"PP4 -> DP1-offload-GA4: {changed['eval_loss']:.7f} (difference {by_reconfiguration:.2e}) | "
          f"other seed: {other_seed['eval_loss']:.7f} (difference {by_seed:.2e})")
    assert by_reconfiguration <= TOLERANCE * base
    assert by_seed > 10 * TOLERANCE * base, "another seed must change the loss far more than the tolerance"


REFUSED = [  # (plan, processes, what the run says)
    ({"dp": 1, "tp": 3}, 3, "does not divide the model's 4 attention heads"),
    ({"dp": 1, "pp": 3, "micro_batches": 1}, 3, "does not divide the model's 4 layers"),
    ({"dp": 1, "tp": 2, "zero_stage": 2}, 2, "ZeRO and ZeRO-Offload run only without"),
    ({"dp": 1, "pp": 2, "micro_batches": 3}, 2, "micro_batches = 3 does not divide"),
]


def _batch(plan: dict) -> int:
    return 6 if plan.get("tp") == 3 or plan.get("pp") == 3 else 8


def test_refused_plans_and_a_foreign_checkpoint_fail_with_the_reason(tmp_path, forks):
    """tp not dividing the heads, pp not dividing the layers, ZeRO with TP, micro-batches not dividing the
    batch: the run fails at once saying why; a checkpoint of another model type is refused, never ignored.

    Every refusal is the trainer's own check (`parallel.check`, `train.read_checkpoint`), asked here of each case
    in this process; a launch under torchrun shows, once for a plan and once for each kind of checkpoint that
    needs the trainer's ranks to find out, that the run ends with that reason (each launch costs some 15 s of
    process start-up on a small machine, the same path for every case; forked from the warm process, less)."""
    from controlplane.events import Plan
    from controlplane.events.schema import build
    from examples.trainer import parallel
    from examples.trainer.data import SumsDataset
    from examples.trainer.model import build_model
    from examples.trainer.train import read_checkpoint

    data = SumsDataset(seq_len=32)
    model = build_model(COMMON["size"], data.vocab_size, data.seq_len, 0, False)
    for plan, _, said in REFUSED:
        with pytest.raises(parallel.PlanUnsupported, match=re.escape(said)):
            parallel.check(build(Plan, plan), model, _batch(plan))
    with pytest.raises(ValueError, match="not a warm launch of agents.torchrun"):  # a user's script is never forked
        forks.start([sys.executable, "-m", "agents.torchrun", "--nproc-per-node=1", "own.py"], tmp_path,
                    tmp_path / "own.txt")
    # a launch that ends at once (torchrun refuses its arguments): its exit code comes back, its error is in its log
    bad = forks.start([sys.executable, "-m", "agents.torchrun", "--preload=examples.trainer.train", "--no-such-option",
                       "own.py"], tmp_path, tmp_path / "bad-args.txt")
    assert bad.wait(60) == 2 and bad.poll() == 2
    assert "unrecognized arguments: --no-such-option" in (tmp_path / "bad-args.txt").read_text()
    plan, nproc, said = REFUSED[2]  # a launch of the same check: the run fails and says why
    with pytest.raises(RuntimeError) as err:
        run(tmp_path / "bad", {**COMMON, "global_batch_size": _batch(plan), "plan": plan}, nproc=nproc, timeout=120,
            forks=forks)
    assert said in str(err.value), str(err.value)

    job = tmp_path / "foreign"
    run(job, {**COMMON, "plan": {"dp": 1, "tp": 2}, "stop_after": 2, "model_type": "other-model"}, nproc=2,
        forks=forks)
    ckpt = job / "checkpoint.pt"
    with pytest.raises(SystemExit, match="is a checkpoint of model type other-model, not example"):
        read_checkpoint(ckpt, "example")
    assert read_checkpoint(ckpt, "other-model")["iteration"] == 2
    with pytest.raises(RuntimeError) as err:
        run(job, {**COMMON, "plan": {"dp": 2}, "model_type": "example"}, nproc=2, attempt=2, timeout=120, forks=forks)
    assert "is a checkpoint of model type other-model, not example" in str(err.value)
    with pytest.raises(RuntimeError) as err:  # a checkpoint of another size of model does not fit
        run(job, {**COMMON, "size": "tiny", "plan": {"dp": 1, "tp": 2}, "model_type": "other-model"}, nproc=2,
            attempt=3, timeout=120, forks=forks)
    assert "cannot resume from" in str(err.value) and "does not fit the model" in str(err.value)
    ckpt.write_bytes(b"\x80\x04torn")
    with pytest.raises(SystemExit, match="cannot read the checkpoint"):
        read_checkpoint(ckpt, "other-model")
