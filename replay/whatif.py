"""What-if: the recorded day again under another policy (or restart cost).

The run's external inputs (node registrations and losses, submissions: every recorded event that
no core and no agent produced, clock ticks aside) are simulated again with fresh cores and simulated
agents, from the recorded configuration and starting parameters with the given changes. The new run
is written like any other (`events/`, `summary.json`), its summary naming the run it came from.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from controlplane.events import Event

from .config import PolicyFactory, RunConfig, load_parts
from .record import read_run
from .run import RunOutput, simulate
from .verify import VerifyResult, load_recorded

INPUT_SUBJECTS = ("job.submitted", "node.registered", "node.lost")


def recorded_inputs(log_dir: Path, run: dict[str, Any]) -> tuple[list[Event], list[str]]:
    produced = {s for sources in run.get("sources", {}).values() for s in sources}
    check = VerifyResult()
    events = load_recorded(log_dir, run, check)
    inputs = [e for _, e, _ in events if e.base in INPUT_SUBJECTS and e.source not in produced]
    return inputs, check.problems


def what_if(log_dir: str | Path, out_dir: str | Path, *, policy: str | None = None,
            restart_cost_s: float | None = None, policy_factory: PolicyFactory | None = None) -> tuple[RunOutput, list[str]]:
    log_dir = Path(log_dir)
    run = read_run(log_dir)
    cfg = RunConfig.from_json(run["config"])
    changes: dict[str, Any] = {}
    if policy is not None:
        changes["policy"] = policy
    if restart_cost_s is not None:
        changes["restart_cost_s"] = restart_cost_s
    cfg = replace(cfg, **changes)
    inputs, problems = recorded_inputs(log_dir, run)
    out = simulate(cfg, inputs, load_parts(params=run["params"]), policy_factory=policy_factory, out_dir=Path(out_dir),
                   extra={"what_if_of": str(log_dir), "what_if_changes": changes,
                          "what_if_input_problems": problems})
    return out, problems
