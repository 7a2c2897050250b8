"""Simulated node agents: a pure core that turns `plan.decided` into job progress.

It stands in for the node agents of a whole cluster (one core for every node; each event it emits
names the agent of the job's first node as its source). Ground truth is `GroundTruth`: the measured
iteration times of the artifact's `throughput_table.csv`, falling back to the fitted performance
model where a configuration was never measured (every fallback is counted).

What a decision does to a job (the policy's contract):

- first non-empty decision: the job starts (`job.started`, attempt 1) at once, or after
  `start_cost_s` where one is set (default 0; the artifact's simulator charges its restart delay on
  the first start too);
- a changed allocation or plan for a running job: checkpoint and relaunch. The job makes no
  progress for `restart_cost_s`, then `job.reconfigured` (its `restart_cost_s` is the time spent
  restarting; a new decision during a restart starts the relaunch again and the cost adds up);
- an empty allocation: `job.preempted` with the whole iterations done (a partial iteration is
  lost); the job keeps its progress. Its next non-empty decision relaunches it from the checkpoint,
  which costs `restart_cost_s` too, then `job.started` with the next attempt number;
- a configuration that cannot run (plan and placement disagree, measured or predicted out of
  memory) fails the job: `job.failed`;
- the target iterations reached: `job.completed`.

While a job runs it reports `metrics.iteration` one iteration after every (re)start and then every
`sample_every_s` seconds (with optional log-normal noise from a seeded generator); a run that ends
within its first iteration reports that iteration as it ends, just before `job.completed`.

Time: `handle(event)` answers at `event.time`; the agents' own timers (completions, restarts done,
samples) are driven by the simulator's virtual clock through `due()` and `fire(now)`. No I/O, no
wall clock; ties are broken by a sequence number, so the order is stable.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from controlplane.events import (Event, JobCompleted, JobFailed, JobPreempted, JobReconfigured, JobStarted,
                                 MetricsIteration, NodeShare, Plan, make)
from modeler.configs import Config, ConfigBatch, ConfigError, check_config
from modeler.predictor import Predictor
from modeler.spec import ModelType
from modeler.table import MeasuredTable

from .fabric import Fabric, Running

NAME = "agents"


@dataclass
class GroundTruth:
    """Seconds per iteration a configuration really takes: the measured table, else the model."""

    table: MeasuredTable
    predictor: Predictor
    models: dict[str, ModelType]
    fallback_lookups: int = 0
    fallback_configs: set[tuple] = field(default_factory=set)
    _cache: dict[tuple, tuple[float, str]] = field(default_factory=dict)

    def iter_time(self, model: str, plan: Plan, gpus_per_node: tuple[int, ...], cpus_per_gpu: int | None,
                  global_batch: int) -> tuple[float, str]:
        """(seconds, source): source is `table`, `model`, or why it cannot run (seconds = inf)."""
        key = (model, plan, gpus_per_node, cpus_per_gpu, global_batch)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._lookup(*key)
            self._cache[key] = hit
        if hit[1] == "model":
            self.fallback_lookups += 1
            self.fallback_configs.add(key)
        return hit

    def peek(self, model: str, plan: Plan, gpus_per_node: tuple[int, ...], cpus_per_gpu: int | None,
             global_batch: int) -> tuple[float, str]:
        """Like `iter_time`, without counting a fallback (for reports, not for running jobs)."""
        key = (model, plan, gpus_per_node, cpus_per_gpu, global_batch)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._lookup(*key)
        return hit

    def _lookup(self, model: str, plan: Plan, gpus_per_node: tuple[int, ...], cpus_per_gpu: int | None,
                global_batch: int) -> tuple[float, str]:
        spec = self.models.get(model)
        if spec is None:
            return math.inf, f"unknown model type {model}"
        cfg = Config(plan=plan, gpus_per_node=gpus_per_node, cpus_per_gpu=cpus_per_gpu,
                     global_batch_size=global_batch)
        try:
            check_config(cfg, allow_tp_across_nodes=spec.allow_tp_across_nodes)
        except ConfigError as exc:
            return math.inf, f"impossible configuration: {exc.detail}"
        measured = self.table.iter_time(model, plan, gpus_per_node, cpus_per_gpu)
        if measured is not None:
            return (measured, "table") if math.isfinite(measured) else (math.inf, "out of memory (measured)")
        batch = ConfigBatch.from_configs([cfg], allow_tp_across_nodes=spec.allow_tp_across_nodes)
        t = float(self.predictor.predict(model, batch).iter_time_s[0])
        return (t, "model") if math.isfinite(t) and t > 0 else (math.inf, "out of memory (predicted)")


@dataclass
class _Job:
    job_id: str
    model: str
    target: int
    batch: int
    done: int = 0
    phase: str = "queued"  # queued | running | restarting | finished
    plan: Plan | None = None
    alloc: tuple[NodeShare, ...] = ()
    gpus_per_node: tuple[int, ...] = ()
    cpus_per_gpu: int | None = None
    iter_s: float = 0.0
    anchor: float = 0.0
    epoch: int = 0
    attempt: int = 0
    restart_began: float = 0.0
    restart_kind: str = ""
    next_sample: float = math.inf
    factor: float = 1.0
    """slowdown from network contention (`agents.fabric`; 1 without a simulated network)"""

    @property
    def eff(self) -> float:
        """Seconds one iteration takes now: the measured time, stretched by contention."""
        return self.iter_s * self.factor


def _shape(alloc: tuple[NodeShare, ...]) -> tuple[tuple[int, ...], int | None]:
    gpus = tuple(s.gpus for s in alloc if s.gpus > 0)
    total_g, total_c = sum(gpus), sum(s.cpus for s in alloc)
    return gpus, (max(1, total_c // total_g) if total_g and total_c else None)


class SimulatedAgents:
    name = NAME
    subjects = ("node.registered", "node.lost", "job.submitted", "job.rejected", "plan.decided")

    def __init__(self, truth: GroundTruth, *, restart_cost_s: float = 78.0, start_cost_s: float = 0.0,
                 sample_every_s: float = 600.0, noise: float = 0.0, seed: int = 0, fabric: Fabric | None = None) -> None:
        if restart_cost_s < 0 or start_cost_s < 0 or sample_every_s <= 0 or noise < 0:
            raise ValueError("restart_cost_s >= 0, start_cost_s >= 0, sample_every_s > 0 and noise >= 0 are required")
        self.truth = truth
        self.restart_cost_s = float(restart_cost_s)
        self.start_cost_s = float(start_cost_s)
        self.sample_every_s = float(sample_every_s)
        self.noise = float(noise)
        self.rng = np.random.default_rng(seed)
        self.jobs: dict[str, _Job] = {}
        self.holding: dict[str, _Job] = {}
        """Jobs running or restarting (they hold an allocation); kept so a round's check is cheap."""
        self.nodes: dict[str, int] = {}
        self.timers: list[tuple[float, int, str, int, str]] = []  # (time, seq, job, epoch, kind)
        self._seq = 0
        self._n = 0
        self.capacity_violations: list[tuple[float, str, int, int]] = []
        self._used: dict[str, int] = {}
        """node -> GPUs the jobs in `holding` hold there, as `_check_capacity` last counted them"""
        self._counted: dict[str, tuple[NodeShare, ...]] = {}
        """job -> the allocation `_used` counts for it (the jobs in `holding` as last checked)"""
        self._moved: set[str] = set()
        """jobs whose allocation or holding may have changed since the last check (`_phase`)"""
        self._resized: set[str] = set()
        """nodes whose GPUs changed (registered, lost) since the last check"""
        self._over: set[str] = set()
        """nodes holding more GPUs than they have, as last checked"""
        self.failures: dict[str, str] = {}
        self.ignored_decisions = 0
        self.restarts = {"start": 0, "reconfigure": 0, "resume": 0}
        self.restart_seconds = {"start": 0.0, "reconfigure": 0.0, "resume": 0.0, "abandoned": 0.0}
        """Time jobs spent restarting, by kind; `abandoned`: restarts cut short by a preemption."""
        self.fabric = fabric
        """The simulated network (None: jobs never slow each other down, the measured times hold)."""
        self.classes: dict[str, int] = {}
        self._changed_at: float | None = None
        self.slowed_s = 0.0
        """Seconds of running time added by network contention, over all jobs (at their last speed change)."""
        if fabric is not None:
            self.subjects = (*self.subjects, "network.decided")

    # --- bus events ------------------------------------------------------------------------------

    def handle(self, event: Event) -> list[Event]:
        base, x, now = event.base, event.payload, event.time
        if base == "plan.decided":
            out: list[Event] = []
            for d in x.decisions:
                out.extend(self._decide(d, now))
            self._check_capacity(now)
            self._changed(now)
            return out
        if base == "network.decided":
            for j in x.cleared:
                self.classes.pop(j, None)
            for d in x.decisions:
                self.classes[d.job_id] = d.traffic_class
            self._changed(now)
            return []
        if base == "job.submitted":
            if x.job_id not in self.jobs:
                self.jobs[x.job_id] = _Job(x.job_id, x.model.type, x.target_iterations, x.global_batch_size)
            return []
        if base == "job.rejected":
            job = self.jobs.get(x.job_id or "")
            if job is not None and job.phase == "queued" and job.attempt == 0:
                job.phase = "finished"
            return []
        if base == "node.registered":
            self.nodes[x.node] = x.gpus
            self._resized.add(x.node)
            return []
        if base == "node.lost":
            self.nodes.pop(x.node, None)
            self._resized.add(x.node)
            out = []
            for job_id in sorted(self.holding):
                job = self.holding[job_id]
                if any(s.node == x.node for s in job.alloc):
                    out.append(self._preempt(job, now, f"node {x.node} lost"))
            return out
        return []

    # --- timers ----------------------------------------------------------------------------------

    def due(self) -> float | None:
        if self._changed_at is not None:
            self._contend(self._changed_at)
        timers = self.timers
        while timers:
            t, _, job_id, epoch, _ = timers[0]
            if self.jobs[job_id].epoch == epoch:
                return t
            heapq.heappop(timers)
        return None

    def fire(self, now: float) -> list[Event]:
        """Everything due at or before `now`, in (time, sequence) order."""
        out: list[Event] = []
        timers = self.timers
        while timers and timers[0][0] <= now:
            t, _, job_id, epoch, kind = heapq.heappop(timers)
            job = self.jobs[job_id]
            if job.epoch != epoch:
                continue
            if kind == "done":
                out.append(self._complete(job, t))
            elif kind == "sample":
                out.append(self._sample(job, t))
            elif kind == "ready":
                out.append(self._ready(job, t))
        return out

    # --- internals -------------------------------------------------------------------------------

    def _id(self) -> str:
        self._n += 1
        return f"ag-{self._n}"

    def _src(self, job: _Job) -> str:
        return f"agent-{job.alloc[0].node}" if job.alloc else NAME

    def _timer(self, t: float, job: _Job, kind: str) -> None:
        self._seq += 1
        heapq.heappush(self.timers, (t, self._seq, job.job_id, job.epoch, kind))

    def _progress(self, job: _Job, now: float) -> None:
        """Credit the whole iterations run since the anchor (a partial one is lost)."""
        if job.phase == "running" and job.iter_s > 0:
            job.done = min(job.target, job.done + int((now - job.anchor) / job.eff + 1e-9))

    def _decide(self, d, now: float) -> list[Event]:
        job = self.jobs.get(d.job_id)
        if job is None or job.phase == "finished":
            self.ignored_decisions += 1
            return []
        alloc = tuple(d.allocation)
        if not alloc or sum(s.gpus for s in alloc) == 0:
            if job.phase in ("running", "restarting"):
                return [self._preempt(job, now, d.reason or "shrunk to zero by the policy")]
            return []
        if d.plan is None:
            return [self._fail(job, now, "decision with an allocation but no plan")]
        if job.phase in ("running", "restarting") and alloc == job.alloc and d.plan == job.plan:
            return []
        gpus, cpus = _shape(alloc)
        t, why = self.truth.iter_time(job.model, d.plan, gpus, cpus, job.batch)
        if not math.isfinite(t):
            job.alloc = alloc
            return [self._fail(job, now, why)]
        self._progress(job, now)
        was = job.phase
        job.plan, job.alloc, job.gpus_per_node, job.cpus_per_gpu, job.iter_s = d.plan, alloc, gpus, cpus, t
        job.epoch += 1
        if was == "queued" and job.attempt == 0 and self.start_cost_s == 0:
            job.attempt = 1
            self._run(job, now)
            return [make("job.started", JobStarted(job.job_id, alloc, d.plan, 1), time=now, id=self._id(),
                         source=self._src(job))]
        if was != "restarting":
            job.restart_began = now
            job.restart_kind = ("start" if job.attempt == 0 else "resume") if was == "queued" else "reconfigure"
        self._phase(job, "restarting", now)
        first = job.attempt == 0
        self._timer(now + (self.start_cost_s if first else self.restart_cost_s), job, "ready")
        return []

    def _run(self, job: _Job, now: float) -> None:
        self._phase(job, "running", now)
        job.anchor = now
        end = now + (job.target - job.done) * job.eff
        job.next_sample = now + job.eff
        if job.next_sample >= end:  # it ends within its first iteration: that iteration is reported as it ends
            job.next_sample = end
            self._timer(end, job, "sample")
        self._timer(end, job, "done")
        if job.next_sample < end:
            self._timer(job.next_sample, job, "sample")

    def _ready(self, job: _Job, now: float) -> Event:
        self._run(job, now)
        src = self._src(job)
        self.restarts[job.restart_kind] += 1
        self.restart_seconds[job.restart_kind] += now - job.restart_began
        if job.restart_kind in ("resume", "start"):
            job.attempt += 1
            return make("job.started", JobStarted(job.job_id, job.alloc, job.plan, job.attempt), time=now,
                        id=self._id(), source=src)
        return make("job.reconfigured", JobReconfigured(job.job_id, job.alloc, job.plan, now - job.restart_began),
                    time=now, id=self._id(), source=src)

    def _sample(self, job: _Job, now: float) -> Event:
        iteration = max(0, job.done + int((now - job.anchor) / job.eff + 1e-9) - 1)
        t = job.eff
        if self.noise > 0:
            t *= float(math.exp(self.rng.normal(0.0, self.noise)))
        nxt = now + self.sample_every_s
        if nxt < job.anchor + (job.target - job.done) * job.eff:
            job.next_sample = nxt
            self._timer(nxt, job, "sample")
        m = MetricsIteration(job_id=job.job_id, model_type=job.model, iteration=iteration, iter_time_s=t,
                             plan=job.plan, gpus_per_node=job.gpus_per_node, node=job.alloc[0].node,
                             cpus_per_gpu=job.cpus_per_gpu)
        return make("metrics.iteration", m, time=now, id=self._id(), source=self._src(job))

    def _complete(self, job: _Job, now: float) -> Event:
        src = self._src(job)
        job.done, job.alloc = job.target, ()
        self._phase(job, "finished", now)
        job.epoch += 1
        return make("job.completed", JobCompleted(job.job_id, job.target), time=now, id=self._id(), source=src)

    def _preempt(self, job: _Job, now: float, reason: str) -> Event:
        self._progress(job, now)
        if job.phase == "restarting":
            self.restart_seconds["abandoned"] += now - job.restart_began
        src = self._src(job)
        job.alloc, job.plan = (), None
        self._phase(job, "queued", now)
        job.epoch += 1
        return make("job.preempted", JobPreempted(job.job_id, reason[:500], job.done), time=now, id=self._id(),
                    source=src)

    def _fail(self, job: _Job, now: float, reason: str) -> Event:
        self._progress(job, now)
        src = self._src(job)
        job.alloc = ()
        self._phase(job, "finished", now)
        job.epoch += 1
        self.failures[job.job_id] = reason
        return make("job.failed", JobFailed(job.job_id, reason[:500]), time=now, id=self._id(), source=src)

    def _phase(self, job: _Job, phase: str, now: float) -> None:
        """Every change of a job's allocation is followed by one of its phase (`_decide`, `_complete`, `_preempt`,
        `_fail`): the capacity check recounts the jobs whose phase was set since it last ran."""
        job.phase = phase
        self._moved.add(job.job_id)
        if phase in ("running", "restarting"):
            self.holding[job.job_id] = job
        else:
            self.holding.pop(job.job_id, None)
            job.factor = 1.0
        self._changed(now)

    # --- network contention (only with a fabric) -------------------------------------------------

    def _changed(self, now: float) -> None:
        """Something that changes who shares the network happened; contention is worked out once all that
        happens at this point in time has been handled (at the next `due`)."""
        if self.fabric is not None:
            self._changed_at = now

    def _contend(self, now: float) -> None:
        self._changed_at = None
        if self.fabric is None:
            return
        # only running jobs send flows (a restarting one is loading its checkpoint)
        running = {j: Running(job.model, job.plan, job.alloc, job.batch) for j, job in self.holding.items()
                   if job.phase == "running" and job.plan is not None}
        factors = self.fabric.slowdowns(running, self.classes)
        for job_id in sorted(self.holding):
            job = self.holding[job_id]
            f = factors.get(job_id, 1.0)
            if f != job.factor:
                self._respeed(job, now, f)

    def _respeed(self, job: _Job, now: float, factor: float) -> None:
        """The job's iteration time changes while it runs: whole iterations done are credited, the partial one
        goes on at the new speed (nothing is lost: no restart)."""
        if job.phase != "running" or job.iter_s <= 0:
            job.factor = factor
            return
        elapsed = max(0.0, (now - job.anchor) / job.eff)
        whole = int(elapsed + 1e-9)
        job.done = min(job.target, job.done + whole)
        frac = max(0.0, elapsed - whole)
        left = job.target - job.done
        self.slowed_s += left * job.iter_s * (factor - job.factor)
        job.factor = factor
        job.anchor = now - frac * job.eff
        job.epoch += 1
        end = max(now, job.anchor + left * job.eff)
        self._timer(end, job, "done")
        nxt = max(job.next_sample, now)
        if nxt < end:
            job.next_sample = nxt
            self._timer(nxt, job, "sample")

    def _check_capacity(self, now: float) -> None:
        """Record every node that holds more GPUs than it has after a decision, by name. The GPUs held on each node
        are kept between checks, and only the jobs whose phase was set since (`_moved`) are counted again: the same
        count as one over every job in `holding`, without walking thousands of running jobs at each decision of a
        large cluster."""
        used, counted, holding, nodes, over = self._used, self._counted, self.holding, self.nodes, self._over
        marked = self._resized
        self._resized = set()
        for job_id in self._moved:
            for s in counted.pop(job_id, ()):
                used[s.node] -= s.gpus
                marked.add(s.node)
            job = holding.get(job_id)
            if job is not None:
                counted[job_id] = job.alloc
                for s in job.alloc:
                    used[s.node] = used.get(s.node, 0) + s.gpus
                    marked.add(s.node)
        self._moved.clear()
        for node in marked:
            if used.get(node, 0) > nodes.get(node, 0):
                over.add(node)
            else:
                over.discard(node)
        for node in sorted(over):
            self.capacity_violations.append((now, node, used[node], nodes.get(node, 0)))

    def unfinished(self) -> list[str]:
        return sorted(j for j, job in self.jobs.items() if job.phase != "finished")
