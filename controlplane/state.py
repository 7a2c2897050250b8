"""The cluster-state fold: `state = fold(events)`.

Every component that needs to know the nodes, jobs, allocations and plans folds
the same events the same way, from the event log or live. Admission is part of
the fold: a `job.submitted` that `check_submission` refuses never becomes a
job, so every folder reaches the same verdict without waiting for the
`job.rejected` answer. Pure code: time comes only from events.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Iterable

from .events import Event, NodeShare, Plan
from .events.catalog import CONTROL, subject_node
from .events.workload import PlanSupport, support_of
from .events import payloads as p

JOB_STATES = ("queued", "running", "completed", "failed", "preempted", "suspended", "cancelled")


@dataclass
class NodeState:
    node: str
    gpus: int
    gpu_mem_gb: float
    cpus: int
    mem_gb: float
    gpu_type: str = ""
    alive: bool = True
    registered_at: float = 0.0
    last_seen: float = 0.0
    jobs: tuple[str, ...] = ()


@dataclass
class JobState:
    job_id: str
    tenant: str
    guaranteed: bool
    model_type: str
    global_batch_size: int
    requested_plan: Plan
    requested: p.Resources
    target_iterations: int
    submitted_at: float
    spec: p.ModelSpec | None = None
    status: str = "queued"
    plan: Plan | None = None
    """Plan in force (from the agents)."""
    allocation: tuple[NodeShare, ...] = ()
    """Resources in force (from the agents)."""
    decided_plan: Plan | None = None
    """Latest plan the policy decided (may not be in force yet)."""
    decided_allocation: tuple[NodeShare, ...] = ()
    predicted_throughput: float = 0.0
    decision_reason: str = ""
    """Why the latest decision about it was made (`queued`, `shrunk`, `preempted`, `guarantee`, ...)."""
    decision_detail: dict[str, str] = field(default_factory=dict)
    pending: p.Pending | None = None
    priority: int = 0
    """From its submission, changed by `job.priority`."""
    support: PlanSupport | None = None
    """The plan features its workload declares (`support_of`); None: it has no workload (it runs what the
    deployment runs such jobs with: the policy's `default_support`)."""
    """Why it waits or runs short, from the policy's `plan.pending` (None: it does not, or not said)."""
    iterations_done: int = 0
    last_iter_time_s: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    reconfigurations: int = 0
    restart_cost_s: float = 0.0
    failure: str = ""
    submission_id: str = ""
    """id of the `job.submitted` event that created the job."""

    @property
    def gpus(self) -> int:
        return sum(s.gpus for s in self.allocation)


@dataclass
class ClusterState:
    known_models: set[str] = field(default_factory=set)
    nodes: dict[str, NodeState] = field(default_factory=dict)
    jobs: dict[str, JobState] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    """job id -> why its submission was refused."""
    open_jobs: dict[str, None] = field(default_factory=dict)
    """ids of the jobs neither completed nor failed (`jobs` keeps every job a long run saw)."""
    model_versions: dict[str, int] = field(default_factory=dict)
    start_quotas: dict[str, int] | None = None
    """The quotas the policy started with (its `run.described`); None: every tenant unlimited."""
    quota_changes: dict[str, int] = field(default_factory=dict)
    """tenant -> GPUs, from `quota.set`, in order: they override the start-up quotas."""
    quota_shares: dict[str, float] = field(default_factory=dict)
    """tenant -> share of the live nodes' GPUs, from `quota.set` with a share (instead of GPUs)."""
    last_round: int = -1
    last_tick: int = -1
    time: float = 0.0
    events: int = 0
    _alive: tuple[NodeState, ...] | None = field(default=None, init=False, repr=False, compare=False)
    """`alive_nodes()`, until a node event changes which nodes are alive (`_nodes_changed`)"""
    _figures: tuple | None = field(default=None, init=False, repr=False, compare=False)
    """`_node_figures()` of `_alive`, kept with it"""

    # --- capacity ---------------------------------------------------------------
    def alive_nodes(self) -> tuple[NodeState, ...]:
        """The live nodes, by name (every round and every submission reads them: kept until a node event
        changes them)."""
        if self._alive is None:
            nodes = self.nodes
            self._alive = tuple(nodes[n] for n in sorted(nodes) if nodes[n].alive)
        return self._alive

    def _nodes_changed(self) -> None:
        self._alive = self._figures = None

    def _node_figures(self) -> tuple:
        """What every submission and round reads of the live nodes as a whole, worked out once per set of live
        nodes: (their GPUs, CPUs and memory together, the most GPUs of one node (0: none live), their names, the
        fewest CPUs per GPU of a node with GPUs (None: none has any))."""
        if self._figures is None:  # `_nodes_changed` drops it with the live nodes
            nodes = self.alive_nodes()
            self._figures = (sum(n.gpus for n in nodes), sum(n.cpus for n in nodes), sum(n.mem_gb for n in nodes),
                             max((n.gpus for n in nodes), default=0), frozenset(n.node for n in nodes),
                             min((n.cpus // n.gpus for n in nodes if n.gpus), default=None))
        return self._figures

    def totals(self) -> tuple[int, int, float]:
        """The live nodes' GPUs, CPUs and memory together."""
        return self._node_figures()[:3]

    def widest(self) -> int:
        """The most GPUs one live node has (0: none is live)."""
        return self._node_figures()[3]

    def alive_names(self) -> frozenset[str]:
        """The names of the live nodes."""
        return self._node_figures()[4]

    def least_cpus_per_gpu(self) -> int | None:
        """The fewest CPUs per GPU of a live node with GPUs (None: none has any)."""
        return self._node_figures()[5]

    def jobs_in(self, *statuses: str) -> list[JobState]:
        """The jobs in any of `statuses`, by id."""
        ids = self.jobs if _FINAL.intersection(statuses) else self.open_jobs
        jobs = self.jobs
        return [jobs[j] for j in sorted(j for j in ids if j in jobs and jobs[j].status in statuses)]

    def open_in(self, *statuses: str) -> list[JobState]:
        """The open jobs (none over) in any of `statuses`, in the order they were first seen: `jobs_in` without
        the sort by id, for a caller to whom the order makes no difference."""
        jobs = self.jobs
        return [job for j in self.open_jobs if (job := jobs.get(j)) is not None and job.status in statuses]

    def quotas(self) -> dict[str, int] | None:
        """The quotas in force: the start-up ones overlaid with every `quota.set`; None: none at all."""
        if self.start_quotas is None and not self.quota_changes and not self.quota_shares:
            return None
        total = self.totals()[0]
        shares = {t: int(math.floor(s * total + 1e-9)) for t, s in self.quota_shares.items()}
        return {**(self.start_quotas or {}), **self.quota_changes, **shares}

    def tenants(self) -> set[str]:
        return {j.tenant for j in self.jobs.values()} | set(self.quotas() or {})

    def quota_refusal(self, x: p.QuotaSet) -> tuple[str, str, str, str] | None:
        """(reason, field, expected, got) when a `quota.set` cannot apply: a tenant nobody has heard of
        (without `new_tenant`), more GPUs than the cluster has."""
        if not x.new_tenant and x.tenant not in self.tenants():
            known = ", ".join(sorted(self.tenants())) or "none yet"
            return ("unknown tenant (set new_tenant for a tenant with no job yet)", "data.tenant",
                    f"one of {known}", x.tenant)
        gpus = self.totals()[0]
        if x.gpus is not None and self.alive_nodes() and x.gpus > gpus:
            return ("more GPUs than the cluster has", "data.gpus", f"<= {gpus}", str(x.gpus))
        return None

    # --- admission -------------------------------------------------------------
    def check_submission(self, sub: p.JobSubmitted) -> tuple[str, str, str, str] | None:
        """(reason, field, expected, got) when the submission must be refused, else None."""
        if sub.job_id in self.jobs or sub.job_id in self.rejected:
            return ("job id reused", "job_id", "an id never used before", sub.job_id)
        if sub.model.type not in self.known_models and sub.model.spec is None:
            known = ", ".join(sorted(self.known_models)) or "none"
            return ("unknown model type (give its full spec to add a new type)", "model.type",
                    f"one of {known}", sub.model.type)
        nodes = self.alive_nodes()
        if nodes:
            gpus, cpus, mem = self.totals()
            r = sub.resources
            if r.gpus > gpus:
                return ("more GPUs than the cluster has", "resources.gpus", f"<= {gpus}", str(r.gpus))
            if r.cpus > cpus:
                return ("more CPUs than the cluster has", "resources.cpus", f"<= {cpus}", str(r.cpus))
            if r.mem_gb > mem:
                return ("more host memory than the cluster has", "resources.mem_gb", f"<= {mem:g}",
                        f"{r.mem_gb:g}")
            widest = self.widest()
            if sub.plan.tp > widest:
                return ("tensor parallelism must stay inside one node", "plan.tp", f"<= {widest}",
                        str(sub.plan.tp))
        refused = support_of(sub.workload).refusal(sub.plan) if sub.workload is not None else None
        if refused is not None:  # the owner's own plan, which its code cannot run
            reason, field_, expected, got = refused
            return (reason + " (its workload's `supports`)", field_, expected, got)
        return None

    def control_refusal(self, event: Event) -> tuple[str, str, str, str] | None:
        """(reason, field, expected, got) when an owner's request (`job.cancel`, `job.suspend`,
        `job.resume`, `job.priority`) cannot apply: an unknown job, one that is over, another tenant's, a suspended job
        suspended again, a resume of a job that is not suspended. None: it applies."""
        x = event.payload
        job = self.jobs.get(x.job_id)
        if job is None:
            return ("unknown job", "job_id", "a job submitted and accepted", x.job_id)
        if x.tenant is not None and x.tenant != job.tenant:
            return (f"job {x.job_id} belongs to another tenant", "tenant", job.tenant, x.tenant)
        if job.status in _FINAL:
            return (f"job {x.job_id} is already {job.status}", "job_id", "a job not yet over", job.status)
        if event.base == "job.suspend" and job.status == "suspended":
            return (f"job {x.job_id} is already suspended", "job_id", "a job not suspended", job.status)
        if event.base == "job.resume" and job.status != "suspended":
            return (f"job {x.job_id} is not suspended", "job_id", "a suspended job", job.status)
        return None

    def refusal(self, event: Event) -> str | None:
        """Why an event is refused (None: accepted): an owner's request that cannot apply
        (`control_refusal`), or a node's lifecycle event about a job started, reconfigured, completed,
        failed or preempted on a node (the subject's last part, `job.completed.<node>`) where it is
        neither placed nor decided to be, or a job nobody submitted. A refused event changes nothing in
        the fold; admission answers it with `job.rejected`."""
        if event.base in CONTROL:
            why = self.control_refusal(event)
            return why[0] if why is not None else None
        node = subject_node(event.subject)
        if node is None or event.base not in _LIFECYCLE:
            return None
        job = self.jobs.get(event.payload.job_id)
        if job is None:
            return f"node {node} reports on job {event.payload.job_id}, which is not known"
        if job.status in _FINAL:
            return None  # a late copy changes nothing
        if node not in {share.node for share in (*job.allocation, *job.decided_allocation)}:
            return f"node {node} reports on job {job.job_id}, which is not placed on it"
        return None

    # --- the fold ------------------------------------------------------------------
    def apply(self, event: Event, checked: bool = False) -> None:
        """Fold `event` in, unless it is refused (`refusal`). `checked`: the caller has just found it not refused,
        with nothing folded since, so it is not asked again."""
        self.events += 1
        if not checked and self.refusal(event) is not None:
            return
        self.time = max(self.time, event.time)
        base = event.base
        handler = _HANDLERS.get(base)
        if handler is not None:
            handler(self, event.payload, event.time)
            if base == "job.submitted":
                job = self.jobs.get(event.payload.job_id)
                if job is not None and not job.submission_id:
                    job.submission_id = event.id
            job_id = getattr(event.payload, "job_id", None)
            if job_id:
                job = self.jobs.get(job_id)
                if job is None or job.status in _FINAL:
                    self.open_jobs.pop(job_id, None)
                else:
                    self.open_jobs[job_id] = None


_FINAL = frozenset({"completed", "failed", "cancelled"})
_HELD = frozenset({"suspended", "cancelled"})
"""States an owner's request put a job in: the agents' reports of its processes stopping keep it there."""
_LIFECYCLE = frozenset({"job.started", "job.reconfigured", "job.completed", "job.failed", "job.preempted"})


def _submitted(s: ClusterState, x: p.JobSubmitted, t: float) -> None:
    verdict = s.check_submission(x)
    if verdict is not None:
        if x.job_id not in s.jobs:
            s.rejected.setdefault(x.job_id, verdict[0])
        return
    if x.model.spec is not None:
        s.known_models.add(x.model.type)
    s.jobs[x.job_id] = JobState(
        job_id=x.job_id, tenant=x.tenant, guaranteed=x.guaranteed, model_type=x.model.type,
        global_batch_size=x.global_batch_size, requested_plan=x.plan, requested=x.resources,
        target_iterations=x.target_iterations, submitted_at=t, spec=x.model.spec, priority=x.priority,
        support=support_of(x.workload) if x.workload is not None else None)


def _started(s: ClusterState, x: p.JobStarted, t: float) -> None:
    job = s.jobs.get(x.job_id)
    if job is not None and job.status in _HELD:  # started before the request reached its node: it stops next
        job.plan, job.allocation = x.plan, x.allocation
    elif job is not None:
        job.status, job.plan, job.allocation = "running", x.plan, x.allocation
        if job.started_at is None:
            job.started_at = t


def _reconfigured(s: ClusterState, x: p.JobReconfigured, t: float) -> None:
    job = s.jobs.get(x.job_id)
    if job is not None:
        job.plan, job.allocation = x.plan, x.allocation
        if job.status not in _HELD:
            job.status = "running"
        job.reconfigurations += 1
        job.restart_cost_s += x.restart_cost_s


def _finished(status: str):
    def apply(s: ClusterState, x, t: float) -> None:
        job = s.jobs.get(x.job_id)
        if job is None:
            return
        held = job.status in _HELD and status == "preempted"  # its processes stopped as the owner asked
        job.status, job.allocation = (job.status if held else status), ()
        job.decided_allocation = ()  # its resources are free again (the decided plan stays as history)
        if status != "preempted":
            job.pending = None
        if status == "completed":
            job.finished_at = t
            job.iterations_done = max(job.iterations_done, x.iterations)
        elif status == "failed":
            job.finished_at = t
            job.failure = x.reason
        elif status == "preempted":
            job.iterations_done = max(job.iterations_done, x.iterations_done)
    return apply


def _cancel(s: ClusterState, x: p.JobControl, t: float) -> None:
    job = s.jobs[x.job_id]  # `refusal` made sure it is there
    job.status, job.finished_at, job.failure = "cancelled", t, x.reason or "cancelled by its owner"
    job.pending = None
    job.decided_allocation = ()  # its resources are free now; its processes stop at the withdrawal


def _suspend(s: ClusterState, x: p.JobControl, t: float) -> None:
    job = s.jobs[x.job_id]
    job.status, job.decided_allocation = "suspended", ()


def _resume(s: ClusterState, x: p.JobControl, t: float) -> None:
    job = s.jobs[x.job_id]
    job.status = "preempted" if job.started_at is not None else "queued"


def _priority(s: ClusterState, x: p.JobPriority, t: float) -> None:
    s.jobs[x.job_id].priority = x.priority  # `refusal` made sure it is there and not over


def _quota_set(s: ClusterState, x: p.QuotaSet, t: float) -> None:
    if s.quota_refusal(x) is None:
        s.quota_changes.pop(x.tenant, None)
        s.quota_shares.pop(x.tenant, None)
        if x.share is not None:
            s.quota_shares[x.tenant] = x.share
        else:
            s.quota_changes[x.tenant] = x.gpus


def _described(s: ClusterState, x: p.RunDescribed, t: float) -> None:
    if x.service == "policy":
        s.start_quotas = dict(x.quotas) if x.quotas is not None else None


def _rejected(s: ClusterState, x: p.Rejected, t: float) -> None:
    if x.subject != "job.submitted" or not x.job_id:
        return
    job = s.jobs.get(x.job_id)
    if job is None:
        s.rejected.setdefault(x.job_id, x.reason)
    elif x.event_id and x.event_id == job.submission_id and job.status == "queued" and not job.decided_allocation:
        # refused after admission (the policy found no plan that runs it): it never becomes a job
        del s.jobs[x.job_id]
        s.rejected[x.job_id] = x.reason


def _node_registered(s: ClusterState, x: p.NodeRegistered, t: float) -> None:
    old = s.nodes.get(x.node)
    s._nodes_changed()
    s.nodes[x.node] = NodeState(x.node, x.gpus, x.gpu_mem_gb, x.cpus, x.mem_gb, x.gpu_type, True,
                                old.registered_at if old else t, t, old.jobs if old else ())


def _heartbeat(s: ClusterState, x: p.NodeHeartbeat, t: float) -> None:
    node = s.nodes.get(x.node)
    if node is not None:
        if not node.alive:
            s._nodes_changed()
        node.alive, node.last_seen, node.jobs = True, t, x.jobs


def _node_lost(s: ClusterState, x: p.NodeLost, t: float) -> None:
    node = s.nodes.get(x.node)
    if node is None:
        return
    s._nodes_changed()
    node.alive, node.jobs = False, ()
    for job in s.jobs.values():
        if job.status == "running" and any(sh.node == x.node for sh in job.allocation):
            job.status, job.allocation = "preempted", ()


def _metrics(s: ClusterState, x: p.MetricsIteration, t: float) -> None:
    job = s.jobs.get(x.job_id)
    if job is not None:
        job.iterations_done = max(job.iterations_done, x.iteration + 1)
        job.last_iter_time_s = x.iter_time_s


def _model_updated(s: ClusterState, x: p.ModelUpdated, t: float) -> None:
    s.known_models.add(x.model_type)
    s.model_versions[x.model_type] = max(x.version, s.model_versions.get(x.model_type, 0))


def _plan_decided(s: ClusterState, x: p.PlanDecided, t: float) -> None:
    s.last_round = max(s.last_round, x.round)
    for d in x.decisions:
        job = s.jobs.get(d.job_id)
        if job is not None:
            job.decided_plan, job.decided_allocation = d.plan, d.allocation
            job.predicted_throughput = d.predicted_throughput
            job.decision_reason, job.decision_detail = d.reason, dict(d.detail)


def _plan_pending(s: ClusterState, x: p.PlanPending, t: float) -> None:
    for j in x.cleared:
        job = s.jobs.get(j)
        if job is not None:
            job.pending = None
    for entry in x.pending:
        job = s.jobs.get(entry.job_id)
        if job is not None and job.status not in _FINAL:
            job.pending = entry


def _tick(s: ClusterState, x: p.ClockTick, t: float) -> None:
    s.last_tick = max(s.last_tick, x.seq)


_HANDLERS = {
    "job.submitted": _submitted,
    "job.started": _started,
    "job.reconfigured": _reconfigured,
    "job.completed": _finished("completed"),
    "job.failed": _finished("failed"),
    "job.preempted": _finished("preempted"),
    "job.rejected": _rejected,
    "job.cancel": _cancel,
    "quota.set": _quota_set,
    "run.described": _described,
    "job.suspend": _suspend,
    "job.resume": _resume,
    "job.priority": _priority,
    "node.registered": _node_registered,
    "node.heartbeat": _heartbeat,
    "node.lost": _node_lost,
    "metrics.iteration": _metrics,
    "model.updated": _model_updated,
    "plan.decided": _plan_decided,
    "plan.pending": _plan_pending,
    "clock.tick": _tick,
}


def fold(events: Iterable[Event], state: ClusterState | None = None,
         known_models: Iterable[str] = ()) -> ClusterState:
    state = state if state is not None else ClusterState(known_models=set(known_models))
    for event in events:
        state.apply(event)
    return state
