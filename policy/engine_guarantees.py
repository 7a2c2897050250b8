"""The Rubick engine's guaranteed jobs: lines 2-3 of Algorithm 1 (each placed within its tenant's quota, charged at
`min_res`), repacking the best-effort jobs to make room, and the quotas."""

from __future__ import annotations

from .curves import packed
from .plans import canonical
from .records import _Job, _Journal


def _made_order(job: _Job) -> tuple:
    """The order a round makes its records in (`RubickEngine._round`): priority, highest first, then submission."""
    inp = job.inp
    return (-inp.priority, inp.order, job.id)


class _Guarantees:
    """Part of `RubickEngine`: its guaranteed jobs and quotas (it reads the round's state the engine keeps)."""

    def _keep_guarantees(self) -> tuple[dict[str, int], set[str]]:
        """The first half of lines 2-3, before the round's slope index is made (`_index_all`, which lists a guarantee
        kept by whether it keeps it with a GPU less): a running guaranteed job within its tenant's quota that meets its
        guarantee keeps it (`privileged`), charged at `min_res`. Returns (tenant -> GPUs so charged, the ids of the
        running guaranteed jobs within quota that do not meet theirs), which `_privileged` goes on from."""
        used: dict[str, int] = {}
        retry: set[str] = set()  # ids: a job is no other's equal, and comparing dataclasses field by field is slow
        for job in self._awake:
            if not (job.inp.guaranteed and job.g and self._quota_left(job, used) >= job.min_g):
                continue
            memo = job.meets_memo
            if job.carried and memo is not None and memo[0] is job.best:
                meets = memo[1]  # carried over: the same placement, plan, reference and margins as then
            else:
                place = canonical(tuple(job.g_on.values()))
                as_asked = job.request is not None and place == job.request.placement  # its own request's GPUs
                meets = self._meets(job, self._guarded(job, job.best, place if as_asked else None)
                                    if job.best is not None else None)
                job.meets_memo = (job.best, meets)
            if meets:
                job.privileged = True
                used[job.inp.tenant] = used.get(job.inp.tenant, 0) + job.min_g
            else:
                retry.add(job.id)
        return used, retry

    def _privileged(self, used: dict[str, int], retry: set[str]) -> bool:
        """Lines 2-3: guaranteed jobs within their tenant's quota, charged at `min_res`. A running
        guaranteed job that meets its guarantee keeps it (`_keep_guarantees`, `used` and `retry`); one that does not
        (it ran over quota before, or its placement is too fragmented) is placed again as a privileged job. True where
        sleepers outside their quota were woken (`_wake_in_quota`)."""
        woken = bool(self._quota_sleepers) and self._wake_in_quota(used)
        for job in self._awake:
            if not job.inp.guaranteed or (job.g and job.id not in retry):
                continue
            if self._quota_left(job, used) < job.min_g:
                said, detail = "exceeded" if self._quota(job) else "none", job.quota_detail
                if detail is None or detail["quota"] != said:  # a detail is replaced, never changed: kept while the same
                    detail = job.quota_detail = {"quota": said}
                job.detail = detail
                self._best_effort(job)
                continue
            job.privileged = True
            released = _Journal()
            if job.g:
                self._release(released, job)
            placed = self._schedule_job(job)
            if not placed and job.want_g > max(1, job.min_g):  # what it wants misses the guarantee: its minimum
                want, job.want_g = job.want_g, max(1, job.min_g)
                placed = self._schedule_job(job)
                job.want_g = want
            if not placed:
                placed = self._repack(job)
            if placed:
                used[job.inp.tenant] = used.get(job.inp.tenant, 0) + job.min_g
                job.reason = "guarantee"
                job.forced = bool(released.ops)
            else:
                self._undo(released, [job])
                job.privileged = False
                job.detail = {"guarantee": "no placement meets it this round"}
                self._best_effort(job)
        for job in self._awake:
            if job.inp.guaranteed and not job.privileged:
                self._best_effort(job)
        self._quota_used = used
        return woken

    def _wake_in_quota(self, used: dict[str, int]) -> bool:
        """Wake the sleepers outside their quota (`_asleep`) that this round might make otherwise; True where any
        woke. A sleeper stays asleep while its tenant's quota, less what the running guarantees kept use
        (`used`, which the rest of the round only adds to), is still under the minimum its guarantee asks, the quota
        is still there or still not, its type's margins are the same, and the GPUs it asks for are the same
        (`_asks`, which follows the clock). The others are made again (`_make_awake`) and take their
        places among the jobs awake, in the order those were made in (priority, then submission): the guarantees'
        order, which spends the quotas."""
        prepared, woken = self._prepared, []
        tenants: dict[str, tuple[int, str]] = {}
        """tenant -> (its quota less what is used of it, what a detail says of its quota)"""
        margins: dict[int, tuple] = {}
        """id of a kind -> its type's margins (`_margins_key`)"""
        for job in self._quota_sleepers.values():
            held = prepared[job.id]
            inp = job.inp
            quota = tenants.get(inp.tenant)
            if quota is None:
                given = self._quota(job)
                quota = tenants[inp.tenant] = (given - used.get(inp.tenant, 0), "exceeded" if given else "none")
            margin = margins.get(id(inp.kind))
            if margin is None:
                margin = margins[id(inp.kind)] = self._margins_key(inp.kind)
            least = held[7][4]  # what its request means as a guarantee (`_demand`)
            if quota[0] >= least or job.detail["quota"] != quota[1] or held[6] != margin:
                woken.append(job)
                continue
            ask = job.asks_memo  # what it asks for, while its seconds since submission stay within the window
            if (ask is None or ask[0] is not held or ask[1] is not inp or ask[2] != inp.remaining_iters
                    or ask[3] != inp.ref_iter_s or ask[4] != inp.running or not ask[5] < inp.elapsed_s < ask[6]):
                asks = self._asks_window(job, held, held[7][3], least)
            else:
                asks = ask[7]
            if job.want_g != asks:
                woken.append(job)
        if not woken:
            return False
        for job in woken:
            self._fall_awake(job)
            self._make_awake(job.inp, prepared, job)
        self._awake.sort(key=_made_order)
        return True

    def _repack(self, job: _Job) -> bool:
        """A guarantee that no placement meets because other guarantees hold a few GPUs on each of
        the nodes it needs: move guaranteed jobs that run on one node onto a node with room, to
        clear those nodes. A moved job gets the fewest GPUs (at least its minimum) with which it
        still ends before its deadline after the restart; one that cannot stays. The nodes to
        clear are those with the fewest such GPUs to move; the jobs are placed biggest first on the
        node with the least room that holds them (best fit). Undone whole when any step fails."""
        plan = self._repack_plan(job)
        if plan is None or not plan[1]:  # no fit; or nothing to move (the plain attempt failed on these nodes already)
            return False
        chosen, moves, size = plan
        jr = _Journal()
        for v, _ in moves:
            self._release(jr, v)
            self._reindex(v)
        ok = self._at_least(job, jr, chosen, max(1, job.min_g))
        for v, to in moves:
            ok = ok and self._at_least(v, jr, [to], size[v.id])
        if not ok:
            self._undo(jr, list(self.jobs.values()))
            return False
        for v, _ in moves:
            self._reindex(v)
            v.forced, v.reason, v.detail = True, "moved", {"by": job.id, "why": "packing guarantees"}
        return True

    def _repack_plan(self, job: _Job) -> tuple[list[str], list[tuple[_Job, str]], dict[str, int]] | None:
        """What `_repack` would do, read without writing anything: the nodes to clear for the job (one for each part of
        its packed minimum), the jobs to move and where to (none: it does nothing), and the GPUs each moved job gets;
        None where no node, or no room for a job to move, fits. Each node picked is the least of a key over the nodes,
        read in one pass: a cluster's first round at 8,192 GPUs repacks over 1,024 nodes."""
        need = packed(max(1, job.min_g), self.book.node_gpus)
        if len(need) > len(self.order):
            return None
        order = self.order
        pinned = dict.fromkeys(order, 0)
        movable: dict[str, list[_Job]] = {}  # only nodes that have one (most of a large cluster's have none)
        size: dict[str, int] = {}
        for v in self.jobs.values():
            if v is job or not v.privileged or v.g <= 0:
                continue
            g = self._size_in_time(v) if len(v.g_on) == 1 else None
            if g is not None:
                movable.setdefault(next(iter(v.g_on)), []).append(v)
                size[v.id] = g
            else:
                for n, g in v.g_on.items():
                    pinned[n] += g
        load = dict.fromkeys(order, 0)
        for n, there in movable.items():
            load[n] = sum(size[v.id] for v in there)
        cap = {n: self.nodes[n].gpus - pinned[n] for n in order}
        chosen: list[str] = []
        for want in need:  # the node the fewest GPUs would leave, of those that hold `want` (names are unique)
            pick = min(((load[n], pinned[n], n) for n in order if cap[n] >= want and n not in chosen), default=None)
            if pick is None:
                return None
            chosen.append(pick[2])
        room = {n: cap[n] - load[n] for n in order}
        for n, want in zip(chosen, need):
            room[n] = cap[n] - want
        moves: list[tuple[_Job, str]] = []
        for v in sorted((v for n in chosen for v in movable.get(n, ())), key=lambda v: (-size[v.id], v.id)):
            g, home = size[v.id], next(iter(v.g_on))
            if room[home] >= g:
                room[home] -= g  # stays where it is
                continue
            pick = min(((room[n], n) for n in order if room[n] >= g), default=None)  # best fit
            if pick is None:
                return None
            to = pick[1]
            room[to] -= g
            moves.append((v, to))
        return chosen, moves, size

    def _size_in_time(self, v: _Job) -> int | None:
        """The fewest GPUs on one node, at least its minimum, with which a running guaranteed job
        restarted now still ends before its deadline (its speed: the reference, or the predicted best
        less the type's margin where that is more); None when no node size does. Every repack of a round asks it of
        every guaranteed job on one node: it is worked out once a round per job, minimum, CPUs per GPU and reference
        (all else it reads, the job's input, the model and the margins, stays the same through a round)."""
        cpg = self._cpg_of(v)
        key = (v.min_g, cpg, v.ref)
        held = self._sizes.get(v.id)
        if held is not None and held[0] == key:
            return held[1]
        size = None
        for g in range(max(1, v.min_g), self.book.node_gpus + 1):
            best = self.book.best(v.inp.kind, (g,), cpg)
            margin = 1 + self._margin(v.inp.kind, best.plan)
            if self._in_time(v, max(v.ref, best.throughput / margin if best.plan is not None else 0.0)):
                size = g
                break
        self._sizes[v.id] = (key, size)
        return size

    def _at_least(self, job: _Job, jr: _Journal, nodes: list[str], gpus: int) -> bool:
        """ScheduleJob on `nodes` only, as if `gpus` were the job's minimum (taking from any job
        over its own minimum), and wanting no more."""
        saved = (job.want_g, job.min_g)
        job.want_g = job.min_g = gpus
        try:
            return self._schedule_job(job, jr, only=nodes)
        finally:
            job.want_g, job.min_g = saved

    def _release(self, jr: _Journal, job: _Job) -> None:
        self._mark_rooms(job.g_on)
        released = list(job.g_on)
        for node in released:
            jr.set(self.free_g, node, self.free_g[node] + job.g_on[node])
            jr.set(self.free_c, node, self.free_c[node] + job.c_on.get(node, 0))
            jr.set(self.on_node, node, self.on_node[node] - {job.id})
            jr.set(job.g_on, node, None)
            jr.set(job.c_on, node, None)
        for node in list(job.mem_on):
            jr.set(self.free_m, node, self.free_m[node] + job.mem_on[node])
            jr.set(job.mem_on, node, None)
        jr.attr(job, "g", 0)
        jr.attr(job, "best", None)
        self._free_changed(released)

    def _best_effort(self, job: _Job) -> None:
        """A guaranteed job outside its quota runs as best-effort: no minimum."""
        if not self.fixed_resources and (job.min_g or job.min_c):
            job.min_g = job.min_c = 0
            self._tables(job)
            self._reindex(job)

    def _quota(self, job: _Job) -> int:
        if self.quotas is None:
            return self._cluster_gpus
        return int(self.quotas.get(job.inp.tenant, 0))

    def _quota_left(self, job: _Job, used: dict[str, int]) -> int:
        return self._quota(job) - used.get(job.inp.tenant, 0)
