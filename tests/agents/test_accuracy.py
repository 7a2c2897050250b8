"""Accuracy across a reconfiguration (the method of Table 3 of the paper): train N iterations with a
change of plan in the middle (DP=2 ZeRO-2 -> DP=1 ZeRO-Offload GA=2, via the checkpoint) and N without;
the final loss differs by less than it does when only the random seed changes."""

from __future__ import annotations

import math

import pytest

from examples.trainer.data import ALPHABET
from examples.trainer.runner import run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

N = 40
BEFORE = {"dp": 2, "zero_stage": 2}
AFTER = {"dp": 1, "zero_stage": 2, "offload": True, "ga_steps": 2}


def test_reconfiguration_changes_the_loss_less_than_the_seed_does(tmp_path):
    common = {"global_batch_size": 8, "target_iterations": N}
    straight = run(tmp_path / "straight", {**common, "plan": BEFORE, "seed": 0}, nproc=2)
    half = run(tmp_path / "changed", {**common, "plan": BEFORE, "seed": 0, "stop_after": N // 2}, nproc=2)
    assert half["state"] == "checkpointed" and half["iteration"] == N // 2
    changed = run(tmp_path / "changed", {**common, "plan": AFTER, "seed": 0}, nproc=1, attempt=2)
    assert changed["started_iteration"] == N // 2 and changed["iteration"] == N
    assert changed["plan"] == "dp1-tp1-pp1-z2-off-ga2"
    # another seed, on one process (a plan changes only the order of the sums: far less than a seed does)
    other_seed = run(tmp_path / "seed", {**common, "plan": {"dp": 1}, "seed": 1}, nproc=1)

    base = straight["eval_loss"]
    assert base < math.log(len(ALPHABET)), "the model did not learn anything"
    by_reconfiguration = abs(changed["eval_loss"] - base)
    by_seed = abs(other_seed["eval_loss"] - base)
    print(f"\nfinal eval loss after {N} iterations: {base:.6f} | with a plan change at {N // 2}: "
          f"{changed['eval_loss']:.6f} (difference {by_reconfiguration:.2e}) | other seed: "
          f"{other_seed['eval_loss']:.6f} (difference {by_seed:.2e})")
    assert by_reconfiguration < by_seed
