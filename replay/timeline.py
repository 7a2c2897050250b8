"""Per-job timelines from an event stream: which GPUs each job held, under which plan, when.

A job holds the allocation of a `plan.decided` from the moment of the decision (a reconfiguring
job holds its new allocation while it restarts, as the simulated agents do) until the next
decision that changes it, an empty decision, or its `job.preempted` / `job.completed` /
`job.failed`. A held segment is `run` from the job's `job.started` / `job.reconfigured` on and
`restart` before it; a lifecycle event for an allocation a later decision already replaced (it can
follow that decision in the stream) is stale and ignored. Pure code over decoded events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from controlplane.events import Event


@dataclass(frozen=True)
class Segment:
    start: float
    end: float
    gpus: int
    plan: str
    state: str  # run | restart


@dataclass
class JobLine:
    job_id: str
    submitted: float
    guaranteed: bool
    model: str
    requested_gpus: int
    target: int
    end: float | None = None
    status: str = "queued"  # queued | completed | failed | rejected
    segments: list[Segment] = field(default_factory=list)
    _open: tuple[float, int, str, str, tuple] | None = None

    def close(self, t: float) -> None:
        if self._open is not None:
            t0, gpus, plan, state, _ = self._open
            if t > t0:
                self.segments.append(Segment(t0, t, gpus, plan, state))
            self._open = None

    def hold(self, t: float, alloc: tuple, plan, state: str) -> None:
        self.close(t)
        self._open = (t, sum(s.gpus for s in alloc), plan.code() if plan is not None else "", state, (alloc, plan))


@dataclass
class Timeline:
    jobs: dict[str, JobLine]
    total_gpus: int
    queue: list[tuple[float, int]]
    """(time, jobs waiting: submitted, unfinished, holding no GPUs) at every change."""
    end: float


def build(events: Iterable[Event]) -> Timeline:
    jobs: dict[str, JobLine] = {}
    nodes: dict[str, int] = {}
    queue: list[tuple[float, int]] = []
    waiting = 0
    t = 0.0

    def mark(now: float) -> None:
        if queue and queue[-1][0] == now:
            queue[-1] = (now, waiting)
        else:
            queue.append((now, waiting))

    for e in events:
        t, base, x = e.time, e.base, e.payload
        if base == "node.registered":
            nodes[x.node] = x.gpus
        elif base == "node.lost":
            nodes.pop(x.node, None)
        elif base == "job.submitted":
            if x.job_id not in jobs:
                jobs[x.job_id] = JobLine(x.job_id, t, x.guaranteed, x.model.type, x.resources.gpus,
                                         x.target_iterations)
                waiting += 1
                mark(t)
        elif base == "job.rejected":
            job = jobs.get(x.job_id or "")
            if job is not None and job.status == "queued" and not job.segments and job._open is None:
                job.status, job.end = "rejected", t
                waiting -= 1
                mark(t)
        elif base == "plan.decided":
            for d in x.decisions:
                job = jobs.get(d.job_id)
                if job is None or job.status != "queued":
                    continue
                was_idle = job._open is None
                if d.allocation and sum(s.gpus for s in d.allocation):
                    if job._open is not None and job._open[4] == (tuple(d.allocation), d.plan):
                        continue
                    job.hold(t, tuple(d.allocation), d.plan, "restart")  # "run" once started
                    if was_idle:
                        waiting -= 1
                        mark(t)
                elif not was_idle:
                    job.close(t)
                    waiting += 1
                    mark(t)
        elif base in ("job.started", "job.reconfigured"):
            job = jobs.get(x.job_id)
            if job is not None and job.status == "queued":
                if job._open is None:  # started without a decision we saw
                    waiting -= 1
                    mark(t)
                elif job._open[4] != (tuple(x.allocation), x.plan):
                    continue  # stale: a later decision already moved the job on (its agent acts on that one)
                job.hold(t, tuple(x.allocation), x.plan, "run")
        elif base in ("job.completed", "job.failed", "job.preempted"):
            job = jobs.get(x.job_id)
            if job is None or job.status != "queued":
                continue
            held = job._open is not None
            job.close(t)
            if base == "job.preempted":
                if held:
                    waiting += 1
                    mark(t)
            else:
                job.status, job.end = base.split(".")[1], t
                if not held:
                    waiting -= 1
                mark(t)
    for job in jobs.values():
        job.close(t)
    return Timeline(jobs, sum(nodes.values()), queue, t)
