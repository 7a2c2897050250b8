"""A test double for the policy core: first-come first-served on the requested plan and GPUs.

Not a policy of the project (those live in `policy/`); it exists so the simulator's mechanics
can be tested on their own. It keeps the policy core's contract: `name`, `subjects`,
`handle(event) -> [plan.decided]` at the input's time, deterministic ids, a round only when
something changed.
"""

from __future__ import annotations

from controlplane.events import Decision, Event, NodeShare, PlanDecided, make


class FifoPolicyDouble:
    name = "policy"
    subjects = ("node.registered", "node.lost", "job.submitted", "job.rejected", "job.completed", "job.failed",
                "job.preempted", "clock.tick")

    def __init__(self) -> None:
        self.free: dict[str, int] = {}
        self.queue: list = []
        self.running: dict[str, tuple[NodeShare, ...]] = {}
        self.round = 0
        self.dirty = False

    def handle(self, event: Event) -> list[Event]:
        b, x = event.base, event.payload
        if b == "node.registered":
            self.free[x.node] = x.gpus
        elif b == "job.submitted":
            self.queue.append(x)
        elif b == "job.rejected":
            self.queue = [j for j in self.queue if j.job_id != x.job_id]
        elif b in ("job.completed", "job.failed", "job.preempted"):
            for s in self.running.pop(x.job_id, ()):
                self.free[s.node] += s.gpus
        elif b == "clock.tick":
            return []
        return self._round(event)

    def _place(self, gpus: int) -> tuple[NodeShare, ...] | None:
        nodes = sorted(self.free)
        if gpus <= max((self.free[n] for n in nodes), default=0):
            node = min((n for n in nodes if self.free[n] >= gpus), key=lambda n: (self.free[n], n))
            return (NodeShare(node, gpus),)
        whole = [n for n in nodes if self.free[n] == 8]
        if gpus % 8 == 0 and len(whole) >= gpus // 8:
            return tuple(NodeShare(n, 8) for n in whole[:gpus // 8])
        return None

    def _round(self, event: Event) -> list[Event]:
        decisions, left = [], []
        for job in self.queue:
            alloc = self._place(job.resources.gpus)
            if alloc is None:
                left.append(job)
                continue
            for s in alloc:
                self.free[s.node] -= s.gpus
            self.running[job.job_id] = alloc
            decisions.append(Decision(job.job_id, alloc, job.plan, reason="fifo"))
        self.queue = left
        if not decisions:
            return []
        self.round += 1
        return [make("plan.decided", PlanDecided(self.round, "fifo-double", tuple(decisions)), time=event.time,
                     id=f"plan-{self.round}", source=self.name)]


def fifo_factory(cfg, parts):
    return FifoPolicyDouble()
