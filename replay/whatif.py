"""What-if: the recorded day again under another policy (or restart cost).

The run's external inputs (node registrations and losses, submissions: every recorded event that
no core and no agent produced, clock ticks aside) are simulated again with fresh cores and simulated
agents, from the recorded configuration and starting parameters with the given changes. The new run
is written like any other (`events/`, `summary.json`), its summary naming the run it came from.

A live run (`rubick up --sim-cluster`) is put on the simulated clock first, counted from its
start-up: the agents' events carry that clock (`sim_clock_origin` at start-up), and a submission,
stamped with its sender's wall-clock time, reached that clock at `sim_clock_origin + (time -
sim_clock_origin) x sim_speed`. The what-if then runs that day as a trace from time 0. A run with
real agents (`clock: "wall"`) is on the wall clock (speed 1, counted from its first start-up), and
its simulated cluster is the nodes that registered in it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from controlplane.events import Event

from .config import RUN_FILE, PolicyFactory, RunConfig, load_parts
from .record import read_run
from .run import RunOutput, simulate
from .verify import VerifyResult, load_recorded

INPUT_SUBJECTS = ("job.submitted", "node.registered", "node.lost")


def recorded_inputs(log_dir: Path, run: dict[str, Any]) -> tuple[list[Event], list[str]]:
    produced = {s for sources in run.get("sources", {}).values() for s in sources}
    check = VerifyResult()
    # bytes a live run stored that are not an event were refused there, and are no input here either
    events = load_recorded(log_dir, run, check, {} if run.get("kind") == "live" else None)
    inputs = [e for _, e, _ in events if e.base in INPUT_SUBJECTS and e.source not in produced]
    return inputs, check.problems


def on_simulated_clock(inputs: list[Event], config: dict[str, Any]) -> list[Event]:
    """A live run's inputs in seconds since its start-up on the simulated clock, in time order (the
    recorded order where times tie)."""
    origin, speed = float(config["sim_clock_origin"]), float(config["sim_speed"])
    timed = []
    for e in inputs:
        t = (e.time - origin) * (speed if e.base == "job.submitted" else 1.0)
        timed.append(replace(e, time=max(0.0, t)))
    return sorted(timed, key=lambda e: e.time)


def cluster_of(inputs: list[Event], log_dir: Path) -> str:
    """"NxG" of the nodes registered among the inputs (G: the most GPUs any of them has)."""
    gpus: dict[str, int] = {}
    for e in inputs:
        if e.base == "node.registered":
            gpus[e.payload.node] = int(e.payload.gpus)
    if not gpus or max(gpus.values()) < 1:
        raise ValueError(f"{log_dir}: no node with GPUs registered in the run; nothing to simulate it on")
    return f"{len(gpus)}x{max(gpus.values())}"


def what_if(log_dir: str | Path, out_dir: str | Path, *, policy: str | None = None,
            restart_cost_s: float | None = None, policy_factory: PolicyFactory | None = None) -> tuple[RunOutput, list[str]]:
    log_dir = Path(log_dir)
    try:
        run = read_run(log_dir)
    except FileNotFoundError:
        raise ValueError(f"{log_dir / RUN_FILE}: missing, so the run's configuration and starting parameters are "
                         "unknown; nothing to simulate again") from None
    except ValueError as exc:
        raise ValueError(f"{log_dir / RUN_FILE}: unreadable ({exc}); nothing to simulate again") from None
    if run.get("kind") == "live" and not {"sim_clock_origin", "sim_speed"} <= set(run.get("config", {})):
        raise ValueError(f"{log_dir / RUN_FILE}: a live run without its simulated clock (sim_clock_origin, "
                         "sim_speed); its submissions cannot be put on that clock")
    cfg = RunConfig.from_json(run["config"])
    changes: dict[str, Any] = {}
    if policy is not None:
        changes["policy"] = policy
    if restart_cost_s is not None:
        changes["restart_cost_s"] = restart_cost_s
    if not cfg.tick_period_s > 0:  # a live run without clock ticks: the simulator keeps time with them
        changes["tick_period_s"] = RunConfig.tick_period_s
    cfg = replace(cfg, **changes)
    inputs, problems = recorded_inputs(log_dir, run)
    extra: dict[str, Any] = {"what_if_of": str(log_dir), "what_if_changes": changes, "what_if_input_problems": problems}
    if run.get("kind") == "live":
        inputs = on_simulated_clock(inputs, run["config"])
        extra["what_if_clock"] = {k: run["config"][k] for k in ("sim_clock_origin", "sim_speed", "clock")
                                  if k in run["config"]}
    if not cfg.cluster:
        cfg = replace(cfg, cluster=cluster_of(inputs, log_dir))
    out = simulate(cfg, inputs, load_parts(params=run["params"]), policy_factory=policy_factory, out_dir=Path(out_dir),
                   extra=extra)
    return out, problems
