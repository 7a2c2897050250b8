"""The baselines of the paper's evaluation, each in the engine interface of `RubickEngine`
(`schedule(nodes, jobs) -> list[Outcome]`), so every policy runs in the same core on equal terms:
the same oracle, the same events, the same restart cost. A job run at a fixed size goes best fit
(`_fit`), or, where no plan of it runs there, on an equal split over more nodes (`_place`).

- `sia` (Jayaram Subramanya et al., SOSP'23): goodput-driven re-allocation of GPU counts every
  round. Kept: the configuration set (1, 2, 4, 8 GPUs, then whole nodes), all jobs re-optimised
  together for the largest sum of normalised throughput, a restart penalty on changes, GPUs
  only (CPUs in proportion to GPUs). Its throughput model knows plain data parallelism: jobs
  scale along DP with GA, and ZeRO, GC and offload are unknown to it (a job asking for them runs
  plain DP). As in the paper's footnote, a job that cannot run plain DP at any size, and every
  3D job, keeps its requested plan and size. Not kept: statistical efficiency (no accuracy model
  here), heterogeneous GPU types.
- `synergy` (Mohan et al., OSDI'22): FIFO with backfilling; each job gets exactly its requested
  GPUs and plan; CPUs follow the job's CPU sensitivity (Synergy-TUNE): the fewest CPUs per GPU
  reaching the top of its CPU curve, at least the node's fair share when it is available, as far as
  the node has free CPUs. Never preempts, never changes a running job.
- `antman` (Xiao et al., OSDI'20): guaranteed jobs within their tenant's quota get exactly the
  requested resources and plan, in submission order, preempting opportunistic (best-effort) jobs
  when idle GPUs are not enough; best-effort jobs run on idle GPUs with their requested size and
  plan (FIFO with backfilling) and are the first to be preempted.
- `equal`: every active job gets an equal share of the GPUs, with the best plan for that share
  (plans re-decided, like Rubick). Jobs are admitted in submission order while their smallest
  runnable sizes fit; a job whose smallest runnable size is over the share gets that size and the
  others share the rest equally (water-filling), so a model that cannot run on one GPU is not
  starved by an equal split it cannot use.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from controlplane.events import Plan
from modeler.spec import ModelType

from .curves import Best, JobKind, PlanBook, packed, request_placements
from .engine import JobIn, NodeCap, Outcome
from .plans import ALL_FAMILIES


@dataclass
class _Simple:
    """Shared bookkeeping: free resources per node, placement by best fit, outcomes."""

    book: PlanBook
    restart_cost_s: float = 78.0
    quotas: dict[str, int] | None = None
    free_g: dict[str, int] = field(default_factory=dict)
    free_c: dict[str, int] = field(default_factory=dict)
    caps: dict[str, NodeCap] = field(default_factory=dict)

    def _reset(self, nodes: list[NodeCap]) -> None:
        self.caps = {n.name: n for n in nodes}
        self.free_g = {n.name: n.gpus for n in nodes}
        self.free_c = {n.name: n.cpus for n in nodes}

    @staticmethod
    def _requested_cpg(job: JobIn) -> int:
        return max(1, job.requested_cpus // max(1, job.requested_gpus))

    def _fair_cpg(self, node: str) -> int:
        cap = self.caps[node]
        return max(1, cap.cpus // max(1, cap.gpus))

    def _keep(self, job: JobIn) -> dict[str, int] | None:
        """The job's current GPUs, if all its nodes still exist and are free enough."""
        if not job.current:
            return None
        if any(n not in self.caps or self.free_g[n] < g for n, (g, _) in job.current.items()):
            return None
        return {n: g for n, (g, _) in job.current.items()}

    def _hold(self, job: JobIn) -> tuple[dict[str, int], dict[str, int]] | None:
        """Take the job's current GPUs and CPUs again, if it can keep them: (GPUs, CPUs) per node."""
        keep = self._keep(job)
        if not keep:
            return None
        cpus = {n: c for n, (_, c) in job.current.items()}
        for n, g in keep.items():
            self.free_g[n] -= g
            self.free_c[n] -= min(self.free_c[n], cpus.get(n, 0))
        return keep, cpus

    def _fit(self, gpus: int, prefer: dict[str, int] | None = None) -> dict[str, int] | None:
        """Best-fit placement: one node with the least free GPUs that holds them all, else whole
        free nodes first and the remainder best-fit."""
        order = sorted(self.free_g, key=lambda n: (self.free_g[n], n))
        for n in order:
            if self.free_g[n] >= gpus:
                return {n: gpus}
        place: dict[str, int] = {}
        left = gpus
        for n in sorted(self.free_g, key=lambda n: (-self.free_g[n], n)):
            if left <= 0:
                break
            take = min(self.free_g[n], left)
            if take > 0:
                place[n] = take
                left -= take
        return place if left <= 0 else None

    def _place(self, job: JobIn, gpus: int, cpg: int) -> dict[str, int] | None:
        """Where `gpus` GPUs of the job go: the best-fit placement (`_fit`) where some plan of the
        job runs on it, else the first equal split of `request_placements` that the free GPUs
        allow and that a plan runs on (a plan measured only on six 4-GPU nodes, TP = 5 on 5-GPU
        nodes), each share on the nodes with the fewest free GPUs that hold it. Without either, the
        best-fit placement (its outcome then says that no plan fits it), or None."""
        place = self._fit(gpus)
        if place is not None and self.book.best_within(job.kind, tuple(place.values()), cpg).plan is not None:
            return place
        for split in request_placements(gpus, self.book.node_gpus)[1:]:
            share = split[0]
            hosts = sorted((n for n in self.free_g if self.free_g[n] >= share), key=lambda n: (self.free_g[n], n))
            if len(hosts) >= len(split) and self.book.best_within(job.kind, split, cpg).plan is not None:
                return {n: share for n in hosts[:len(split)]}
        return place

    def _take(self, place: dict[str, int], cpg: int) -> dict[str, int]:
        cpus = {}
        for n, g in place.items():
            self.free_g[n] -= g
            c = min(self.free_c[n], g * cpg)
            self.free_c[n] -= c
            cpus[n] = c
        return cpus

    def _give(self, place: dict[str, int], cpus: dict[str, int]) -> None:
        for n, g in place.items():
            self.free_g[n] += g
            self.free_c[n] += cpus.get(n, 0)

    def _cpg(self, place: dict[str, int], cpus: dict[str, int]) -> int:
        return max(1, min(cpus.get(n, 0) // g for n, g in place.items())) if place else 1

    def _best(self, job: JobIn, place: dict[str, int], cpus: dict[str, int]) -> Best:
        return self.book.best_within(job.kind, tuple(place.values()), self._cpg(place, cpus))

    def _outcome(self, job: JobIn, place: dict[str, int] | None, cpus: dict[str, int], reason: str,
                 detail: dict[str, str] | None = None) -> Outcome:
        if not place:
            return Outcome(job.job_id, {}, None, 0.0, "preempted" if job.current else "queued", detail or {})
        best = self._best(job, place, cpus)
        if best.plan is None:
            return Outcome(job.job_id, {}, None, 0.0, "queued", {"why": "no plan fits the placement"})
        nodes = sorted(place, key=lambda n: (-place[n], n))
        shares = {n: (g, cpus.get(n, 0), 0.0) for n, g in zip(nodes, best.placement) if g > 0}
        mem = 0.0
        if best.plan.offload:
            mem = self.book.oracle.host_mem_gb(job.kind.model, job.kind.global_batch, best.placement, best.plan)
        asked = job.requested_mem_gb / max(1, job.requested_gpus)  # the owner's memory, per GPU held
        shares = {n: (g, c, round(max(mem / len(shares), asked * g), 3)) for n, (g, c, _) in shares.items()}
        return Outcome(job.job_id, shares, best.plan, best.throughput, reason, detail or {})

    def _quota_ok(self, job: JobIn, used: dict[str, int]) -> bool:
        if self.quotas is None:
            return True
        return used.get(job.tenant, 0) + job.requested_gpus <= self.quotas.get(job.tenant, 0)


# --- synergy -------------------------------------------------------------------------------
@dataclass
class SynergyEngine(_Simple):
    def _want_cpg(self, job: JobIn, place: dict[str, int]) -> int:
        curve = self.book.cpu_curve(job.kind, tuple(place.values()))
        top = curve.max()
        knee = int(next((c for c in range(1, len(curve)) if curve[c] >= top * (1 - 1e-9)), 1)) if top > 0 else 1
        fair = min(self._fair_cpg(n) for n in place)
        return max(knee, min(fair, job.requested_cpus // max(1, job.requested_gpus) or fair))

    def schedule(self, nodes: list[NodeCap], jobs: list[JobIn]) -> list[Outcome]:
        self._reset(nodes)
        out: dict[str, Outcome] = {}
        waiting = []
        for job in sorted(jobs, key=lambda j: (j.order, j.job_id)):
            held = self._hold(job)
            if held:
                out[job.job_id] = self._outcome(job, *held, "keep")
            else:
                waiting.append(job)
        for job in waiting:
            place = self._place(job, job.requested_gpus, self._requested_cpg(job))
            if place is None:
                out[job.job_id] = self._outcome(job, None, {}, "queued")
                continue
            cpus = self._take(place, self._want_cpg(job, place))
            o = self._outcome(job, place, cpus, "start", {"cpus_per_gpu": str(self._cpg(place, cpus))})
            if not o.shares:
                self._give(place, cpus)
            out[job.job_id] = o
        return [out[j.job_id] for j in jobs]


# --- antman --------------------------------------------------------------------------------
@dataclass
class AntManEngine(_Simple):
    def schedule(self, nodes: list[NodeCap], jobs: list[JobIn]) -> list[Outcome]:
        self._reset(nodes)
        ordered = sorted(jobs, key=lambda j: (j.order, j.job_id))
        used: dict[str, int] = {}
        guaranteed = set()
        for job in ordered:
            if job.guaranteed and self._quota_ok(job, used):
                used[job.tenant] = used.get(job.tenant, 0) + job.requested_gpus
                guaranteed.add(job.job_id)
        out: dict[str, Outcome] = {}
        held: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
        for job in ordered:  # running jobs keep their resources for now
            kept = self._hold(job)
            if kept:
                held[job.job_id] = kept
        for job in ordered:  # guaranteed jobs waiting: idle GPUs, else preempt best-effort jobs
            if job.job_id not in guaranteed or job.job_id in held:
                continue
            place = self._place(job, job.requested_gpus, self._requested_cpg(job))
            victims = []
            if place is None:
                for v in sorted((j for j in ordered if j.job_id in held and j.job_id not in guaranteed),
                                key=lambda j: (-j.order, j.job_id)):
                    self._give(*held.pop(v.job_id))
                    victims.append(v.job_id)
                    place = self._place(job, job.requested_gpus, self._requested_cpg(job))
                    if place is not None:
                        break
            if place is None:
                continue
            cpus = self._take(place, self._requested_cpg(job))
            held[job.job_id] = (place, cpus)
            for v in victims:
                out[v] = Outcome(v, {}, None, 0.0, "preempted", {"by": job.job_id})
        for job in ordered:  # best-effort jobs on what is idle
            if job.job_id in held or job.job_id in out:
                continue
            if job.job_id in guaranteed:
                continue
            place = self._place(job, job.requested_gpus, self._requested_cpg(job))
            if place is not None:
                held[job.job_id] = (place, self._take(place, self._requested_cpg(job)))
        for job in ordered:
            if job.job_id in out:
                continue
            if job.job_id in held:
                place, cpus = held[job.job_id]
                reason = "keep" if job.current else ("guarantee" if job.job_id in guaranteed else "opportunistic")
                out[job.job_id] = self._outcome(job, place, cpus, reason)
            else:
                out[job.job_id] = self._outcome(job, None, {}, "queued")
        return [out[j.job_id] for j in jobs]


# --- equal share ---------------------------------------------------------------------------
@dataclass
class EqualEngine(_Simple):
    def schedule(self, nodes: list[NodeCap], jobs: list[JobIn]) -> list[Outcome]:
        self._reset(nodes)
        ordered = sorted(jobs, key=lambda j: (j.order, j.job_id))
        total = sum(n.gpus for n in nodes)
        active, least, room = [], {}, total  # in order, every job whose smallest runnable size still fits
        for job in ordered:
            g = self._smallest(job)
            if g and g <= room:
                active.append(job)
                least[job.job_id] = g
                room -= g
        share = self._water_level(total, [least[j.job_id] for j in active])
        out: dict[str, Outcome] = {}
        for job in active:
            g = self._usable(job, max(share, least[job.job_id]))
            if g and job.current and sum(x for x, _ in job.current.values()) == g:
                held = self._hold(job)
                if held:
                    out[job.job_id] = self._outcome(job, *held, "keep")
        for job in active:
            if job.job_id in out:
                continue
            g = self._usable(job, max(share, least[job.job_id]))
            place = self._place(job, g, min(self._fair_cpg(n) for n in self.caps)) if g else None
            if place is None:
                out[job.job_id] = self._outcome(job, None, {}, "queued")
                continue
            cpus = self._take(place, min(self._fair_cpg(n) for n in place))
            o = self._outcome(job, place, cpus, "equal-share", {"share": str(share)})
            if not o.shares:
                self._give(place, cpus)
            out[job.job_id] = o
        for job in ordered:
            if job.job_id not in out:
                out[job.job_id] = self._outcome(job, None, {}, "queued")
        return [out[j.job_id] for j in jobs]

    @staticmethod
    def _water_level(total: int, least: list[int]) -> int:
        """The largest equal share s with sum(max(least, s)) <= total: jobs that need more than the
        share get their smallest runnable size, the others share what is left equally."""
        lo, hi = 1, max(1, total)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if sum(max(g, mid) for g in least) <= total:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _smallest(self, job: JobIn) -> int:
        """The fewest GPUs on which some plan of the job runs (0: none within a curve's range)."""
        curve = self.book.gpu_curve(job.kind, max(1, job.requested_cpus // max(1, job.requested_gpus)) or 1)
        for g in range(1, len(curve)):
            if self.book.best(job.kind, packed(g, self.book.node_gpus), 4).plan is not None:
                return g
        return 0

    def _usable(self, job: JobIn, share: int) -> int:
        """The largest GPU count up to the share on which some plan runs (0: none)."""
        curve = self.book.gpu_curve(job.kind, max(1, job.requested_cpus // max(1, job.requested_gpus)) or 1)
        for g in range(min(share, len(curve) - 1), 0, -1):
            if self.book.best(job.kind, packed(g, self.book.node_gpus), 4).plan is not None:
                return g
        return 0


# --- sia -----------------------------------------------------------------------------------
@dataclass
class SiaEngine(_Simple):
    @staticmethod
    def kind(model: ModelType, gbs: int, plan: Plan) -> JobKind:
        if plan.tp > 1 or plan.pp > 1:
            return JobKind(model, gbs, ALL_FAMILIES, template=plan, scale_dp=False)
        return JobKind(model, gbs, ("dp",))

    def _sizes(self, job: JobIn, total: int) -> list[int]:
        node = self.book.node_gpus
        if job.kind.template is not None:
            return [job.requested_gpus]
        sizes = [s for s in (1, 2, 4, 8) if s <= node] + list(range(2 * node, min(total, self.book.max_gpus) + 1, node))
        return [s for s in sizes if s <= total]

    def _fixed_kind(self, job: JobIn) -> JobIn:
        kind = JobKind(job.kind.model, job.kind.global_batch, ALL_FAMILIES, template=job.requested_plan,
                       scale_dp=False, support=job.kind.support)
        return replace(job, kind=kind)

    def schedule(self, nodes: list[NodeCap], jobs: list[JobIn]) -> list[Outcome]:
        self._reset(nodes)
        total = sum(n.gpus for n in nodes)
        cpg = {j.job_id: max(1, j.requested_cpus // max(1, j.requested_gpus)) if j.requested_cpus else 4 for j in jobs}
        jobs = [self._fixed_kind(j) if j.kind.template is None and self.book.gpu_curve(j.kind, cpg[j.job_id]).max() <= 0
                else j for j in jobs]
        ordered = sorted(jobs, key=lambda j: (j.order, j.job_id))
        tput: dict[tuple[str, int], float] = {}

        def value(j: JobIn, g: int) -> float:
            key = (j.job_id, g)
            if key not in tput:  # on the packed placement, else the first equal split a plan runs on
                tput[key] = next((b.throughput for b in (self.book.best(j.kind, p, cpg[j.job_id])
                                                         for p in request_placements(g, self.book.node_gpus))
                                  if b.plan is not None), 0.0)
            return tput[key]

        ref = {j.job_id: value(j, j.requested_gpus) or max((value(j, g) for g in self._sizes(j, total)), default=0)
               or 1.0 for j in ordered}
        current = {j.job_id: sum(g for g, _ in j.current.values()) for j in ordered}
        size: dict[str, int] = {}
        left = total
        for j in ordered:  # everyone gets its smallest runnable configuration, oldest first
            options = [g for g in self._sizes(j, total) if value(j, g) > 0]
            if options and options[0] <= left:
                start = current[j.job_id] if current[j.job_id] in options and current[j.job_id] <= left else options[0]
                if start != options[0] and not j.running:
                    start = options[0]
                size[j.job_id] = start
                left -= start
        while left > 0:  # then the largest gain in normalised throughput per GPU
            best_gain, pick = 0.0, None
            for j in ordered:
                g = size.get(j.job_id)
                if not g:
                    continue
                nxt = [s for s in self._sizes(j, total) if s > g and s - g <= left and value(j, s) > 0]
                if not nxt:
                    continue
                s = nxt[0]
                gain = (value(j, s) - value(j, g)) / ref[j.job_id] / (s - g)
                if j.running and current[j.job_id] == g:
                    gbs = j.kind.global_batch
                    saved = j.remaining_iters * (gbs / value(j, g) - gbs / value(j, s))
                    if saved <= self.restart_cost_s:
                        continue
                if gain > best_gain + 1e-12:
                    best_gain, pick = gain, (j.job_id, s)
            if pick is None:
                break
            left -= pick[1] - size[pick[0]]
            size[pick[0]] = pick[1]
        out: dict[str, Outcome] = {}
        for j in sorted(ordered, key=lambda j: (-size.get(j.job_id, 0), j.order)):  # place big jobs first
            g = size.get(j.job_id, 0)
            if g and current[j.job_id] == g:
                held = self._hold(j)
                if held:
                    out[j.job_id] = self._outcome(j, *held, "keep")
        for j in sorted(ordered, key=lambda j: (-size.get(j.job_id, 0), j.order)):
            if j.job_id in out:
                continue
            g = size.get(j.job_id, 0)
            place = self._place(j, g, cpg[j.job_id]) if g else None
            if place is None:
                out[j.job_id] = self._outcome(j, None, {}, "queued")
                continue
            cpus = self._take(place, cpg[j.job_id])
            o = self._outcome(j, place, cpus, "goodput", {"gpus": str(g)})
            if not o.shares:
                self._give(place, cpus)
            out[j.job_id] = o
        return [out[j.job_id] for j in jobs]
