"""One simulated run, end to end: trace + configuration -> event log, run.json, summary.json."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from controlplane import gc_tuning
from controlplane.events import Event, JobSubmitted, make

from agents.simulated import GroundTruth, SimulatedAgents
from policy.curves import request_placements

from . import stopping
from .config import Parts, PolicyFactory, RunConfig, control_cores, fabric, node_events, node_gpus
from .progress import SimCallback, current as progress_hook
from .record import write_log
from .simulator import SimResult, Simulation
from .summary import summarize
from .trace import TraceJob

SUMMARY_FILE = "summary.json"
EVENTS_DIR = "events"


@dataclass
class RunOutput:
    summary: dict[str, Any]
    result: SimResult
    files: list[Path]
    write_s: float


def ground_truth(parts: Parts) -> GroundTruth:
    return GroundTruth(parts.table, parts.predictor(), dict(parts.models))


def reference_time(truth: GroundTruth, node_gpus: int):
    def ref(sub: JobSubmitted) -> float:
        fallback = math.inf
        for place in request_placements(sub.resources.gpus, node_gpus):
            t, source = truth.peek(sub.model.type, sub.plan, place, None, sub.global_batch_size)
            if source == "table":
                return t
            if math.isfinite(t) and not math.isfinite(fallback):
                fallback = t
        return fallback
    return ref


def submissions(jobs: Sequence[TraceJob], parts: Parts) -> list[Event]:
    return [make("job.submitted", j.submission(parts.batches[j.model]), time=j.submit_s, id=f"sub-{j.name}",
                 source="trace") for j in jobs]


@gc_tuning.pausing  # the cores make no reference cycles (`controlplane.gc_tuning`)
def simulate(cfg: RunConfig, inputs: Sequence[Event], parts: Parts, *, policy_factory: PolicyFactory | None = None,
             out_dir: Path | None = None, extra: dict[str, Any] | None = None,
             progress: SimCallback | None = None) -> RunOutput:
    """Run the cores over `inputs` (node events and submissions, time-ordered); write the run if
    `out_dir` is given (`events/` log with run.json, and summary.json). `progress` (default: the one
    `replay.progress.current` holds, if any) is told how far the simulation got (display only)."""
    import time

    truth = ground_truth(parts)
    nodes = [e.payload.node for e in inputs if e.base == "node.registered"]
    agents = SimulatedAgents(truth, restart_cost_s=cfg.restart_cost_s, start_cost_s=cfg.start_cost_s,
                             sample_every_s=cfg.sample_every_s,
                             noise=cfg.noise, seed=cfg.seed, fabric=fabric(cfg, parts, nodes))
    sim = Simulation(control_cores(cfg, parts, policy_factory), agents, tick_period_s=cfg.tick_period_s,
                     max_time_s=cfg.max_time_s)
    with stopping.during(sim):  # a time limit or Ctrl-C: the run stops and what it simulated is written
        result = sim.run(inputs, progress if progress is not None else progress_hook.get())
    sim_extra = {
        "config": cfg.to_json(),
        "stop_reason": result.stop_reason,
        "end_time_s": result.end_time,
        "fallback_to_model": {"lookups": truth.fallback_lookups, "configs": len(truth.fallback_configs)},
        "restarts": {"counts": dict(agents.restarts), "seconds": dict(agents.restart_seconds),
                     "total_cost_s": float(sum(agents.restart_seconds.values()))},
        "failures": dict(sorted(agents.failures.items())),
        "capacity_violations": len(agents.capacity_violations),
        "ignored_decisions": agents.ignored_decisions,
        **({"network": {"mode": cfg.network, "slowed_s": agents.slowed_s,
                        "fluid_simulations": agents.fabric.simulations}} if agents.fabric is not None else {}),
        **(extra or {}),
    }
    summary = summarize(result.events, result.wire, reference_time(truth, node_gpus(cfg)), extra=sim_extra,
                        start_cost_s=cfg.start_cost_s, quotas=cfg.quotas)
    files: list[Path] = []
    t0 = time.perf_counter()
    if out_dir is not None:
        out_dir = Path(out_dir)
        files = write_log(out_dir / EVENTS_DIR, ((e.subject, w, e.time) for e, w in zip(result.events, result.wire)),
                          config=cfg.to_json(), params=parts.params, sources=result.sources,
                          extra={"plan_decided_sha256": summary["plan_decided_sha256"]})
        (out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return RunOutput(summary, result, files, time.perf_counter() - t0)


def trace_inputs(cfg: RunConfig, jobs: Sequence[TraceJob], parts: Parts) -> list[Event]:
    return [*node_events(cfg.cluster), *submissions(jobs, parts)]
