"""The scheduler's Prometheus metrics, computed by the policy service's shell.

The policy core stays pure: it never sees these. The shell (`controlplane.service.ServiceShell`)
calls `SchedulerMetrics.before(event)` and `after(event, out)` around each `handle()`, and this
module reads the core's state (its `ClusterState` fold, its last outcomes, its progress) and the
events it consumed and emitted, and sets the metrics of `controlplane.metrics`:

- `rubick_jobs_pending{tenant}` (queued or preempted), `rubick_jobs_running{tenant}`;
- `rubick_jobs_waiting{tenant,reason}`: jobs waiting or running short, by the pending reason of the
  policy's latest `plan.pending` (docs/policy.md, "Why a job waits");
- `rubick_gpus_total`, `rubick_gpus_allocated` (GPUs of live nodes that the policy's decisions hold),
  `rubick_gpus_free`;
- `rubick_quota_gpus{tenant}` (the configured quota) and `rubick_quota_used_gpus{tenant}` (GPUs held by
  the tenant's guaranteed jobs that run within its quota; the engine charges each at its minimum
  demand, which is at most what it holds);
- `rubick_guaranteed_jobs{tenant}` and `rubick_guaranteed_behind{tenant}`: open guaranteed jobs within
  quota, and those of them waiting or running more than `BEHIND_TOLERANCE` under their reference
  throughput (the owner's plan on the requested GPUs; measured speed when the job has reported on its
  current configuration, else the decision's prediction);
- `rubick_reconfigurations_total{tenant}`, `rubick_restart_cost_seconds_total{tenant}` (from the
  agents' `job.reconfigured`, the measured restart cost);
- `rubick_round_seconds` (histogram): wall time of each scheduling round, measured here;
- `rubick_model_refits_total{model_type}`, `rubick_model_fit_rmsle{model_type}` (from `model.updated`),
  `rubick_prediction_error_ratio{model_type}` (histogram of |measured - predicted| / predicted
  throughput of the first measured iteration of each decided configuration) and
  `rubick_prediction_overshoot_ratio{model_type}` (the oracle's guarantee margin).

Counters count the events of the stream the service has read, the rebuild at start included, so a
restarted service's counters carry on from the history instead of dropping to zero; rounds are
timed live only. Label values are bounded: past `MAX_LABELS` distinct tenants (or model types) the
rest are counted under `other`.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

from . import metrics as m

log = logging.getLogger(__name__)

MAX_LABELS = 200
"""Distinct values a label takes at most; the rest are folded into `OTHER`."""
OTHER = "other"
BEHIND_TOLERANCE = 0.05
"""A guaranteed job is behind when its throughput is under (1 - this) x its reference."""
THROTTLED = frozenset({"metrics.iteration", "node.heartbeat", "clock.tick"})
"""Events after which the gauges are recomputed at most every `refresh_s` (the others: always)."""


def is_policy_core(core: Any) -> bool:
    """Whether `core` looks like `policy.service.PolicyCore` (duck-typed: the control plane does not
    import the policy package)."""
    return all(hasattr(core, a) for a in ("state", "engine", "last", "progress", "run_round", "job_in", "oracle"))


def observer_for(core: Any) -> "SchedulerMetrics | None":
    return SchedulerMetrics(core) if is_policy_core(core) else None


@dataclass
class _Labels:
    seen: dict[str, None] = field(default_factory=dict)

    def __call__(self, value: str) -> str:
        if value in self.seen:
            return value
        if len(self.seen) < MAX_LABELS:
            self.seen[value] = None
            return value
        return OTHER


@dataclass
class SchedulerMetrics:
    core: Any
    refresh_s: float = 1.0
    """least wall time between two recomputations of the gauges after a throttled event"""
    tenants: _Labels = field(default_factory=_Labels)
    types: _Labels = field(default_factory=_Labels)
    rounds: int = 0
    """rounds timed (live)"""
    _shown: set = field(default_factory=set)
    """tenant labels the gauges were set for (set to 0 once a tenant has no jobs)"""
    _waiting_shown: set = field(default_factory=set)
    """(tenant, reason) labels `rubick_jobs_waiting` was set for"""
    _refreshed: float = -math.inf
    _refs: dict = field(default_factory=dict)
    """job id -> (model version, reference throughput)"""
    _compared: dict = field(default_factory=dict)
    """job id -> the configuration whose first measured iteration was compared with its prediction"""
    _before: tuple | None = None
    _live: bool = True
    _round_s: float | None = None

    def __post_init__(self) -> None:
        inner = self.core.run_round

        def timed(event):  # the shell's stopwatch around the core's round; the round itself is unchanged
            t0 = time.perf_counter()
            try:
                return inner(event)
            finally:
                self._round_s = time.perf_counter() - t0

        self.core.run_round = timed
        for tenant in sorted(getattr(self.core.engine, "quotas", None) or {}):
            self.tenants(tenant)

    # --- around a handle() --------------------------------------------------------------------
    def before(self, event, live: bool = True) -> None:
        self._live, self._round_s, self._before = live, None, None
        try:
            if event.base == "job.reconfigured":
                job = self.core.state.jobs.get(event.payload.job_id)
                self._before = (job.reconfigurations, job.restart_cost_s) if job is not None else None
        except Exception:  # metrics never stop a service
            log.exception("scheduler metrics: before %s", event.subject)

    def after(self, event, out) -> None:
        try:
            self._after(event, out)
        except Exception:
            log.exception("scheduler metrics: after %s", event.subject)

    def _after(self, event, out) -> None:
        if self._round_s is not None and self._live:
            m.ROUND_SECONDS.observe(self._round_s)
            self.rounds += 1
        base = event.base
        state = self.core.state
        if base == "job.reconfigured" and self._before is not None:
            job = state.jobs.get(event.payload.job_id)
            if job is not None and job.reconfigurations > self._before[0]:
                tenant = self.tenants(job.tenant)
                m.RECONFIGURATIONS.labels(tenant).inc(job.reconfigurations - self._before[0])
                m.RESTART_COST_SECONDS.labels(tenant).inc(max(0.0, job.restart_cost_s - self._before[1]))
        elif base == "model.updated":
            upd = event.payload
            kind = self.types(upd.model_type)
            m.MODEL_REFITS.labels(kind).inc()
            m.MODEL_FIT_RMSLE.labels(kind).set(float(upd.rmsle))
        elif base == "metrics.iteration":
            self._prediction_error(event.payload)
        elif base in ("job.completed", "job.failed"):
            self._compared.pop(event.payload.job_id, None)
            self._refs.pop(event.payload.job_id, None)
        if not self._live:
            return  # rebuilding the state at start: the gauges are set once it is rebuilt (`refresh`)
        now = time.perf_counter()
        if base not in THROTTLED or self._round_s is not None or out or now - self._refreshed >= self.refresh_s:
            self._refreshed = now
            self.refresh()

    def _prediction_error(self, x) -> None:
        job = self.core.state.jobs.get(x.job_id)
        if job is None or job.decided_plan is None or not job.decided_allocation or job.predicted_throughput <= 0:
            return
        held = tuple(sorted((s.gpus for s in job.decided_allocation if s.gpus), reverse=True))
        config = (job.decided_plan, held)
        if x.plan != job.decided_plan or tuple(sorted(x.gpus_per_node, reverse=True)) != held:
            return  # a report from a configuration other than the one decided (the restart is under way)
        if self._compared.get(x.job_id) == config or not (x.iter_time_s > 0 and math.isfinite(x.iter_time_s)):
            return
        self._compared[x.job_id] = config
        measured = job.global_batch_size / x.iter_time_s
        m.PREDICTION_ERROR.labels(self.types(job.model_type)).observe(
            abs(measured - job.predicted_throughput) / job.predicted_throughput)

    # --- the gauges ------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Set every gauge from the core's state now."""
        core, state = self.core, self.core.state
        alive = {n.node: n.gpus for n in state.alive_nodes()}
        pending: dict[str, int] = {}
        running: dict[str, int] = {}
        used: dict[str, int] = {}
        guaranteed: dict[str, int] = {}
        behind: dict[str, int] = {}
        allocated = 0
        waiting: dict[tuple[str, str], int] = {}
        for job in state.jobs_in("queued", "running", "preempted"):
            tenant = self.tenants(job.tenant)
            if job.pending is not None:
                waiting[tenant, job.pending.reason] = waiting.get((tenant, job.pending.reason), 0) + 1
            gpus = sum(s.gpus for s in job.decided_allocation if s.node in alive)
            allocated += gpus
            if job.status == "running":
                running[tenant] = running.get(tenant, 0) + 1
            else:
                pending[tenant] = pending.get(tenant, 0) + 1
            if not job.guaranteed:
                continue
            outcome = core.last.get(job.job_id)
            if outcome is not None and "quota" in getattr(outcome, "detail", {}):
                continue  # over its tenant's quota: it runs as best-effort, with no guarantee
            guaranteed[tenant] = guaranteed.get(tenant, 0) + 1
            used[tenant] = used.get(tenant, 0) + gpus
            if self._behind(job, gpus):
                behind[tenant] = behind.get(tenant, 0) + 1
        total = sum(alive.values())
        m.GPUS_TOTAL.set(total)
        m.GPUS_ALLOCATED.set(allocated)
        m.GPUS_FREE.set(max(0, total - allocated))
        quotas = getattr(core.engine, "quotas", None) or {}
        tenants = set(pending) | set(running) | set(guaranteed) | self._shown
        for q in quotas:
            tenant = self.tenants(q)
            tenants.add(tenant)
            m.QUOTA_GPUS.labels(tenant).set(sum(int(v) for k, v in quotas.items() if self.tenants(k) == tenant))
        for tenant in tenants:
            m.JOBS_PENDING.labels(tenant).set(pending.get(tenant, 0))
            m.JOBS_RUNNING.labels(tenant).set(running.get(tenant, 0))
            m.QUOTA_USED_GPUS.labels(tenant).set(used.get(tenant, 0))
            m.GUARANTEED_JOBS.labels(tenant).set(guaranteed.get(tenant, 0))
            m.GUARANTEED_BEHIND.labels(tenant).set(behind.get(tenant, 0))
        self._shown = tenants
        for key in set(waiting) | self._waiting_shown:
            m.JOBS_WAITING.labels(*key).set(waiting.get(key, 0))
        self._waiting_shown = set(waiting) | self._waiting_shown
        overshoot = getattr(core.oracle, "overshoot", None)
        if isinstance(overshoot, dict):
            for kind, miss in sorted(overshoot.items()):
                m.PREDICTION_OVERSHOOT.labels(self.types(kind)).set(float(miss))

    def _behind(self, job, gpus: int) -> bool:
        if gpus <= 0 or job.status != "running":
            return True  # waiting (or restarting) while it is owed its reference speed
        ref = self._reference(job)
        if not ref:
            return False
        p = self.core.progress.get(job.job_id)
        speed = (job.global_batch_size / p.iter_time_s) if p is not None and p.iter_time_s else job.predicted_throughput
        return speed < (1.0 - BEHIND_TOLERANCE) * ref

    def _reference(self, job) -> float | None:
        """The job's reference throughput (`RubickEngine.reference`), once per job and model version."""
        reference = getattr(self.core.engine, "reference", None)
        if reference is None:
            return None
        version = self.core.oracle.version(job.model_type)
        held = self._refs.get(job.job_id)
        if held is not None and held[0] == version:
            return held[1]
        inp = self.core.job_in(job, self.core.state.time)
        ref = float(reference(inp)[0]) if inp is not None else 0.0
        ref = ref if ref > 0 and math.isfinite(ref) else 0.0
        self._refs[job.job_id] = (version, ref)
        return ref
