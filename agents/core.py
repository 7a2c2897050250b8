"""The node agent's core: from events and observed process facts, what to launch, stop and report.

Pure (DESIGN.md): no I/O, time only from its inputs, ids derived from its inputs. Three entry points:

- `handle(event)`: bus events (`job.submitted`, `plan.decided[.<node>]`, the job lifecycle). Returns
  the events to publish (`plan.rejected`, and lifecycle events it can conclude at once).
- `observe(fact)`: what the shell saw its processes do (`Started`, `FirstIteration`, `Exited`,
  `LaunchFailed`). Returns lifecycle events.
- `reconcile(found, time)`: after a restart, the jobs found on the node's disk, alive or not.

Each may queue actions (`Launch`, `Stop`, `Kill`) that the shell takes with `take_actions()`.
With `restoring` set, `handle` only learns facts (no events, no actions): the shell replays the
stream through it after a restart, then calls `reconcile`.

A job's lifecycle on this node: `launching` -> `running`; a new plan or placement sends it to
`stopping` (checkpoint asked) and then `restarting` (relaunched, waiting for its first iteration,
which closes `job.reconfigured` with the measured restart cost); a decision that takes the node
away sends it to `stopping` and then `job.preempted`. Processes that exit otherwise give
`job.completed` (state `completed`) or `job.failed` (with exit code and log tail), and their
resources are released.

Traffic classes: the agent keeps the latest class `network.decided` gave each job (a job it lists in
`cleared` drops back to none), and every `Launch` carries the job's class at that moment (None: none
known), which the launchers turn into the training processes' environment (`agents.traffic`). NCCL reads
those variables when it creates a communicator, so a class that changes while a job runs takes effect at
the job's next launch (a reconfiguration, a resume); the agent does not restart a job for it. A job placed
by a decision that `network.decided` has not answered yet starts with the class it had before, if any.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controlplane.events import Decision, Event, NodeShare, Plan, Rejected, make
from controlplane.events import payloads as p
from controlplane.events.catalog import CONTROL, subject_node

from .node import NodeCapacity
from .plan_check import JobInfo, Refusal, check_decision, share_in, share_of

_NODE_FACTS = ("job.started", "job.reconfigured", "job.completed", "job.failed", "job.preempted", "node.registered",
               "node.lost")
SUBJECTS = ("job.submitted", *_NODE_FACTS, *(f"{s}.>" for s in _NODE_FACTS), "plan.decided", "plan.decided.>",
            "network.decided", "network.decided.>")
"""What an agent reads; the node-scoped facts come bare (recorded logs, simulated agents) or with a node."""
TERMINAL = ("completed", "failed")


# --- actions (for the shell) -----------------------------------------------------------------------

@dataclass(frozen=True)
class Launch:
    job: JobInfo
    plan: Plan
    allocation: tuple[NodeShare, ...]
    share: NodeShare
    attempt: int
    devices: tuple[int, ...]
    cpu_cores: tuple[int, ...]
    """Cores to bind to; empty = not bound (the share asked for none)."""
    traffic_class: int | None = None
    """The job's traffic class from the latest `network.decided` (None: none known)."""


@dataclass(frozen=True)
class Stop:
    job_id: str
    attempt: int
    reason: str


@dataclass(frozen=True)
class Kill:
    job_id: str
    attempt: int


Action = Launch | Stop | Kill


# --- facts (from the shell) ----------------------------------------------------------------------

@dataclass(frozen=True)
class Started:
    job_id: str
    attempt: int
    time: float


@dataclass(frozen=True)
class FirstIteration:
    job_id: str
    attempt: int
    time: float


@dataclass(frozen=True)
class Exited:
    job_id: str
    attempt: int
    time: float
    exit_code: int | None
    """None when unknown (a process this agent did not start, adopted after a restart)."""
    state: str | None
    """What the trainer said last: running, checkpointed, completed (None: nothing)."""
    iterations: int = 0
    log_tail: str = ""
    reason: str = ""
    """Why it ended when no exit code tells (a pod evicted or deleted); empty: the exit code says."""


@dataclass(frozen=True)
class LaunchFailed:
    job_id: str
    attempt: int
    time: float
    reason: str


@dataclass(frozen=True)
class Found:
    """A job found in the agent's state folder after a restart."""

    job_id: str
    attempt: int
    plan: Plan
    allocation: tuple[NodeShare, ...]
    devices: tuple[int, ...]
    cpu_cores: tuple[int, ...]
    alive: bool
    state: str | None
    iterations: int = 0
    log_tail: str = ""


@dataclass(frozen=True)
class NodeCondition:
    """The node's own health as its cluster sees it (the Kubernetes launcher: the Node's Ready condition).
    Not ready past the launcher's grace: the core reports `node.lost` for its node, once until it is
    ready again."""

    node: str
    time: float
    ready: bool
    reason: str = ""


Fact = Started | FirstIteration | Exited | LaunchFailed | NodeCondition


@dataclass
class LocalJob:
    """A job with processes (or about to have them) on this node."""

    job: JobInfo
    plan: Plan
    allocation: tuple[NodeShare, ...]
    share: NodeShare
    attempt: int
    devices: tuple[int, ...] = ()
    cpu_cores: tuple[int, ...] = ()
    phase: str = "launching"
    """launching | running | stopping | waiting (for devices) | restarting"""
    next: Decision | None = None
    """The decision to carry out once the stop is done (None: preempted)."""
    stop_asked_at: float | None = None
    reconfiguring: bool = False
    stop_reason: str = ""
    iterations: int = 0
    """Iterations done at the last checkpoint."""


def _ident(*parts: Any) -> str:
    return "-".join(str(x) for x in parts)[:128]


@dataclass
class AgentCore:
    capacity: NodeCapacity
    restoring: bool = False
    jobs: dict[str, JobInfo] = field(default_factory=dict)
    local: dict[str, LocalJob] = field(default_factory=dict)
    decided: dict[str, Decision] = field(default_factory=dict)
    """Latest accepted decision per job that places it on this node (or took it away)."""
    status: dict[str, str] = field(default_factory=dict)
    """Last lifecycle subject seen per job (started, reconfigured, completed, failed, preempted)."""
    attempts: dict[str, int] = field(default_factory=dict)
    nodes: set[str] = field(default_factory=set)
    """Nodes registered and not lost (the allocation of a decision may name only these)."""
    node_lost: bool = False
    """`node.lost` was reported for this node and it has not been ready since."""
    traffic: dict[str, int] = field(default_factory=dict)
    """Latest traffic class per job from `network.decided` (absent: none, or cleared)."""
    _actions: list[Action] = field(default_factory=list)

    name = "agent"
    subjects = SUBJECTS

    @property
    def node(self) -> str:
        return self.capacity.node

    def take_actions(self) -> list[Action]:
        out, self._actions = self._actions, []
        return out

    def running_jobs(self) -> tuple[str, ...]:
        return tuple(sorted(self.local))

    # --- bus events ------------------------------------------------------------------------------
    def handle(self, event: Event) -> list[Event]:
        x, base = event.payload, event.base
        if base == "job.submitted":
            self.jobs.setdefault(x.job_id, JobInfo(x.job_id, x.model.type, x.global_batch_size,
                                                   x.target_iterations, x.workload))
            return []
        if base in CONTROL:
            return []  # an owner's request: the policy's decision that follows is what the agent carries out
        if base.startswith("job.") and base != "job.rejected":
            if x.job_id in self.local and subject_node(event.subject) not in (None, self.node):
                return []  # another node cannot speak for a job running here
            if self.status.get(x.job_id) not in TERMINAL:  # a late copy never revives an ended job
                self.status[x.job_id] = base.split(".", 1)[1]
            if base == "job.started":
                self.attempts[x.job_id] = max(self.attempts.get(x.job_id, 0), x.attempt)
            return []
        if base == "node.registered":
            self.nodes.add(x.node)
        elif base == "node.lost":
            self.nodes.discard(x.node)
        elif base == "plan.decided":
            return self._plan(event)
        elif base == "network.decided":
            for job_id in x.cleared:
                self.traffic.pop(job_id, None)
            for d in x.decisions:
                self.traffic[d.job_id] = d.traffic_class
        return []

    def _plan(self, event: Event) -> list[Event]:
        out: list[Event] = []
        decisions = event.payload.decisions
        # the node's use once this round is carried out: decided shares replace current ones
        routed = event.subject == f"plan.decided.{self.node}"
        mine = [(i, d) for i, d in enumerate(decisions)
                if share_of(d, self.node) is not None or d.job_id in self.local or routed]
        deciding = {d.job_id for _, d in mine}
        used = self._usage(exclude=deciding)
        for i, d in mine:
            refusal = self._refusal(d, used)
            if refusal is not None:
                out.append(self._reject(event, i, d.job_id, refusal))
                continue
            share = share_of(d, self.node)
            if share is not None:
                used = (used[0] + share.gpus, used[1] + share.cpus, used[2] + share.mem_gb)
            self.decided[d.job_id] = d
            if not self.restoring:
                out += self._carry_out(d, event.time)
        if self.restoring:
            return []
        return out

    def _refusal(self, d: Decision, used: tuple[int, int, float]) -> Refusal | None:
        job = self.jobs.get(d.job_id)
        share = share_of(d, self.node)
        if job is None:
            return ("unknown job", "job_id", "a job submitted before", d.job_id)
        if self.status.get(d.job_id) in TERMINAL and d.allocation:
            return (f"job already {self.status[d.job_id]}", "job_id", "a job still to run", d.job_id)
        unknown = sorted({s.node for s in d.allocation} - self.nodes - {self.node})
        if unknown:
            return ("unknown node", "allocation.node", "a registered node", ", ".join(unknown))
        if share is None:
            return None  # nothing here, or taken away from this node: always allowed
        refusal = check_decision(d, job, self.capacity)
        if refusal is not None:
            return refusal
        cap = self.capacity
        if used[0] + share.gpus > cap.gpus:
            return ("not enough free devices on the node", "allocation.gpus", f"<= {cap.gpus - used[0]} free",
                    str(share.gpus))
        if share.cpus and used[1] + share.cpus > cap.cpus:
            return ("not enough free CPU cores on the node", "allocation.cpus", f"<= {cap.cpus - used[1]} free",
                    str(share.cpus))
        if share.mem_gb and used[2] + share.mem_gb > cap.mem_gb:
            return ("not enough free host memory on the node", "allocation.mem_gb",
                    f"<= {cap.mem_gb - used[2]:g} free", f"{share.mem_gb:g}")
        return None

    def _usage(self, exclude: set[str] = frozenset()) -> tuple[int, int, float]:
        """Devices, cores and memory the node's jobs hold once their pending decisions are carried out."""
        gpus, cpus, mem = 0, 0, 0.0
        for job_id in sorted(self.local):
            if job_id in exclude:
                continue
            lj = self.local[job_id]
            share = lj.share if lj.phase != "stopping" else (share_of(lj.next, self.node) if lj.next else None)
            if share is not None:
                gpus, cpus, mem = gpus + share.gpus, cpus + share.cpus, mem + share.mem_gb
        return gpus, cpus, mem

    def _reject(self, event: Event, index: int, job_id: str, refusal: Refusal) -> Event:
        reason, fld, expected, got = refusal
        payload = Rejected(subject=event.subject, reason=f"node {self.node}: {reason}",
                           field=f"data.decisions[{index}].{fld}", expected=expected[:500], got=got[:500],
                           event_id=event.id, job_id=job_id)
        return make(f"plan.rejected.{self.node}", payload, time=event.time, id=_ident("rej", event.id, self.node, job_id),
                    source=f"agent-{self.node}")

    def _carry_out(self, d: Decision, now: float) -> list[Event]:
        lj = self.local.get(d.job_id)
        share = share_of(d, self.node)
        if lj is None:
            if share is not None:
                self._new_local(d, share)
                self._launch_waiting()
            return []
        if lj.phase in ("stopping", "waiting"):
            lj.next = d if share is not None else None
            if lj.phase == "waiting" and share is None:
                del self.local[d.job_id]
                if lj.reconfiguring:  # it had run here and holds a checkpoint: now it waits elsewhere
                    return self._lifecycle("job.preempted", p.JobPreempted(
                        job_id=d.job_id, reason=d.reason or "allocation withdrawn", iterations_done=lj.iterations),
                        now, lj, "preempted")
            elif lj.phase == "waiting":
                self._retarget(lj, d, share)
                self._launch_waiting()
            return []
        if share is not None and d.plan == lj.plan and d.allocation == lj.allocation:
            return []  # already in force (a repeated round or a redelivery)
        lj.next = d if share is not None else None
        lj.phase, lj.stop_asked_at = "stopping", now
        lj.reconfiguring = share is not None
        lj.stop_reason = "reconfigure" if share is not None else (d.reason or "allocation withdrawn")
        self._actions.append(Stop(d.job_id, lj.attempt, lj.stop_reason))
        return []

    def _new_local(self, d: Decision, share: NodeShare) -> LocalJob:
        lj = LocalJob(job=self.jobs[d.job_id], plan=d.plan, allocation=d.allocation, share=share,
                      attempt=self.attempts.get(d.job_id, 0), phase="waiting")
        self.local[d.job_id] = lj
        return lj

    def _retarget(self, lj: LocalJob, d: Decision, share: NodeShare) -> None:
        lj.plan, lj.allocation, lj.share, lj.next = d.plan, d.allocation, share, None

    def _launch_waiting(self) -> None:
        """Launch the waiting jobs whose devices and cores are free now, in job-id order."""
        for job_id in sorted(self.local):
            lj = self.local[job_id]
            if lj.phase != "waiting":
                continue
            devices = self._free(range(self.capacity.gpus), "devices", lj.share.gpus)
            cores = self._free(range(self.capacity.cpus), "cpu_cores", lj.share.cpus) if lj.share.cpus else ()
            if devices is None or cores is None:
                continue
            lj.devices, lj.cpu_cores = devices, cores
            lj.attempt = max(lj.attempt, self.attempts.get(job_id, 0)) + 1
            self.attempts[job_id] = lj.attempt
            lj.phase = "restarting" if lj.reconfiguring else "launching"
            self._actions.append(Launch(lj.job, lj.plan, lj.allocation, lj.share, lj.attempt, devices, cores,
                                        self.traffic.get(job_id)))

    def _free(self, ids: range, what: str, count: int) -> tuple[int, ...] | None:
        held = {i for lj in self.local.values() if lj.phase != "waiting" for i in getattr(lj, what)}
        free = [i for i in ids if i not in held]
        return tuple(free[:count]) if len(free) >= count else None

    # --- facts from the shell --------------------------------------------------------------------
    def observe(self, fact: Fact) -> list[Event]:
        if isinstance(fact, NodeCondition):
            return self._node_condition(fact)
        lj = self.local.get(fact.job_id)
        if lj is None or fact.attempt != lj.attempt:
            return []  # about an attempt that is over
        if isinstance(fact, Started):
            if lj.phase == "launching":
                lj.phase = "running"
                return self._lifecycle("job.started", p.JobStarted(job_id=lj.job.job_id, allocation=lj.allocation,
                                                                   plan=lj.plan, attempt=lj.attempt),
                                       fact.time, lj, "started")
            return []
        if isinstance(fact, FirstIteration):
            if lj.phase == "restarting":
                lj.phase, lj.reconfiguring = "running", False
                cost = max(0.0, fact.time - (lj.stop_asked_at or fact.time))
                return self._lifecycle("job.reconfigured", p.JobReconfigured(
                    job_id=lj.job.job_id, allocation=lj.allocation, plan=lj.plan, restart_cost_s=round(cost, 6)),
                    fact.time, lj, "reconfigured")
            return []
        if isinstance(fact, LaunchFailed):
            return self._failed(lj, fact.time, f"launch failed: {fact.reason}", None, "")
        return self._exited(lj, fact)

    def _node_condition(self, x: NodeCondition) -> list[Event]:
        if x.node != self.node or x.ready == (not self.node_lost):
            return []  # another node's (agents speak for their own only), or nothing new
        self.node_lost = not x.ready
        if x.ready:
            return []  # its heartbeats bring it back
        return [make(f"node.lost.{self.node}", p.NodeLost(node=self.node, reason=x.reason[:500] or "not ready"),
                     time=x.time, id=_ident(self.node, "lost", f"{x.time:.3f}"), source=f"agent-{self.node}")]

    def _exited(self, lj: LocalJob, x: Exited) -> list[Event]:
        if x.state == "completed" and x.exit_code in (0, None):
            del self.local[lj.job.job_id]
            self.status[lj.job.job_id] = "completed"
            self._launch_waiting()
            return self._lifecycle("job.completed", p.JobCompleted(job_id=lj.job.job_id, iterations=x.iterations),
                                   x.time, lj, "completed")
        if lj.phase == "stopping" and x.state == "checkpointed" and x.exit_code in (0, None):
            if lj.next is not None:
                share = share_of(lj.next, self.node)
                self._retarget(lj, lj.next, share)
                lj.phase, lj.iterations = "waiting", x.iterations
                self._launch_waiting()
                return []
            del self.local[lj.job.job_id]
            self._launch_waiting()
            return self._lifecycle("job.preempted", p.JobPreempted(job_id=lj.job.job_id, reason=lj.stop_reason,
                                                                   iterations_done=x.iterations), x.time, lj,
                                   "preempted")
        code = "unknown" if x.exit_code is None else str(x.exit_code)
        reason = x.reason or (f"training processes exited with code {code} in state {x.state or 'unknown'}"
                              if x.exit_code is not None else
                              "training processes gone (not started by this agent instance)")
        return self._failed(lj, x.time, reason, x.exit_code, x.log_tail)

    def _failed(self, lj: LocalJob, now: float, reason: str, code: int | None, tail: str) -> list[Event]:
        del self.local[lj.job.job_id]
        self.status[lj.job.job_id] = "failed"
        self._actions.append(Kill(lj.job.job_id, lj.attempt))  # whatever is left of the job goes
        self._launch_waiting()
        return self._lifecycle("job.failed", p.JobFailed(job_id=lj.job.job_id, reason=reason, exit_code=code,
                                                         log_tail=tail[-16_000:]), now, lj, "failed")

    def _lifecycle(self, subject: str, payload: Any, now: float, lj: LocalJob, kind: str) -> list[Event]:
        """Lifecycle events come from the node of the job's first share only (one report per job)."""
        self.status[lj.job.job_id] = kind
        leader = next((s.node for s in lj.allocation if s.gpus > 0), self.node)
        if leader != self.node:
            return []
        return [make(f"{subject}.{self.node}", payload, time=now, id=_ident(self.node, lj.job.job_id, f"a{lj.attempt}", kind),
                     source=f"agent-{self.node}")]

    # --- after a restart -------------------------------------------------------------------------
    def reconcile(self, found: list[Found], now: float) -> list[Event]:
        """Take over the jobs found alive, report those that ended while the agent was away, and carry
        out accepted decisions that were never acted on. Never launches a job that is alive."""
        self.restoring = False
        out: list[Event] = []
        self.local.clear()
        for f in sorted(found, key=lambda f: f.job_id):
            job = self.jobs.get(f.job_id)
            if job is None:
                continue
            share = share_in(f.allocation, self.node)
            if share is None:
                continue
            self.attempts[f.job_id] = max(self.attempts.get(f.job_id, 0), f.attempt)
            lj = LocalJob(job=job, plan=f.plan, allocation=f.allocation, share=share, attempt=f.attempt,
                          devices=f.devices, cpu_cores=f.cpu_cores, phase="running")
            self.local[f.job_id] = lj
            if not f.alive:
                if self.status.get(f.job_id) in TERMINAL:
                    del self.local[f.job_id]
                    continue
                if f.state == "checkpointed":  # stopped for a change the agent did not live to carry out
                    del self.local[f.job_id]
                    d = self.decided.get(f.job_id)
                    if d is not None and share_of(d, self.node) is not None:
                        lj = self._new_local(d, share_of(d, self.node))
                        lj.reconfiguring, lj.stop_asked_at, lj.attempt = True, now, f.attempt
                        lj.iterations = f.iterations
                    else:
                        out += self._lifecycle("job.preempted", p.JobPreempted(
                            job_id=f.job_id, reason="stopped while the agent was down", iterations_done=f.iterations),
                            now, lj, "preempted")
                    continue
                out += self._exited(lj, Exited(f.job_id, f.attempt, now, None, f.state, f.iterations, f.log_tail))
        for job_id in sorted(self.decided):
            d = self.decided[job_id]
            if self.status.get(job_id) in TERMINAL:
                continue
            if job_id in self.local:
                if self.local[job_id].phase != "waiting":
                    out += self._carry_out(d, now)
            elif share_of(d, self.node) is not None and self.status.get(job_id) in (None, "preempted"):
                out += self._carry_out(d, now)
            elif share_of(d, self.node) is not None:
                lj = self._new_local(d, share_of(d, self.node))
                lj.phase = "running"
                lj.attempt = self.attempts.get(job_id, 0)
                out += self._failed(lj, now, "training processes gone while the agent was down", None, "")
        self._launch_waiting()
        return out
