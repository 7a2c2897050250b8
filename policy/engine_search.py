"""The Rubick engine's ScheduleJob: an attempt gathers GPUs (free ones, then those of jobs of lower slope), settles
the best plan on what it gathered, gives back what the plan leaves unused, allocates CPUs and memory, and is kept
or undone; the restart rule decides whether a running job's own change is worth its restart."""

from __future__ import annotations

import math
from itertools import dropwhile

from .curves import Best, knee, slope_down, slope_up
from .plans import canonical
from .records import _MISSING, EPS, _Job, _Journal, _Order

_UNSET = object()
"""a shape not worked out (`_Search._settle_entry`)"""


class _Search:
    """Part of `RubickEngine`: one job's attempt (ScheduleJob) and the restart rule."""

    def _move(self, jr: _Journal, node: str, src: _Job | None, dst: _Job, gpus: int) -> None:
        """`gpus` GPUs on `node` to `dst`, free ones (`src` None) or `src`'s, written in `jr`. The journal's `set` and
        `attr` of the two jobs' GPUs and of `src`'s CPUs and the node's free CPUs are written out here (the same
        entries, in the same order): a cluster's first round at 8,192 GPUs makes 30,096 moves."""
        if self._room_of is not None:
            self._room_stale.add(node)
        ops = jr.ops
        if src is None:
            jr.set(self.free_g, node, self.free_g[node] - gpus)
            self._free_changed((node,))
        else:
            g_on = src.g_on
            had, c = g_on[node], src.c_on.get(node, 0)
            left = had - gpus
            ops.append((g_on, node, had))  # jr.set(g_on, node, left if left > 0 else None)
            if left > 0:
                g_on[node] = left
            else:
                del g_on[node]
            ops.append((src, "g", src.g))  # jr.attr(src, "g", src.g - gpus)
            src.g -= gpus
            src.touched = True
            c_on, free_c = src.c_on, self.free_c
            ops.append((c_on, node, c_on.get(node, _MISSING)))  # jr.set(c_on, node, its CPUs kept, or None)
            if left > 0:  # it keeps its CPUs per GPU on what it keeps there (at least one a GPU), at most what it had
                per = c // had
                keep_c = left * per if per > 1 else left
                if keep_c > c:  # noqa: PLR1730 (`min` written out: a call costs more, every move)
                    keep_c = c
                c_on[node] = keep_c
            else:
                keep_c = 0
                c_on.pop(node, None)
            free = free_c[node]
            ops.append((free_c, node, free))  # jr.set(free_c, node, free + (c - keep_c))
            free_c[node] = free + (c - keep_c)
            if left <= 0:
                jr.set(self.on_node, node, self.on_node[node] - {src.id})
                if node in src.mem_on:  # off the node: its memory there is free again
                    jr.set(self.free_m, node, self.free_m[node] + src.mem_on[node])
                    jr.set(src.mem_on, node, None)
        d_on = dst.g_on
        was = d_on.get(node, _MISSING)
        ops.append((d_on, node, was))  # jr.set(d_on, node, d_on.get(node, 0) + gpus)
        d_on[node] = (0 if was is _MISSING else was) + gpus
        ops.append((dst, "g", dst.g))  # jr.attr(dst, "g", dst.g + gpus)
        dst.g += gpus
        dst.touched = True
        if dst.id not in self.on_node[node]:
            jr.set(self.on_node, node, self.on_node[node] | {dst.id})

    def _schedule_job(self, job: _Job, jr: _Journal | None = None, only: list[str] | None = None) -> bool:
        """ScheduleJob; `jr` records its changes in a caller's journal (a repack), `only` limits the
        nodes it visits."""
        if job.g >= job.want_g and job.g >= job.min_g:
            return job.g > 0
        if job.g and job.g >= job.min_g and job.id in self.held:
            if self._any_free() or self._beats(job, self.lowest):
                self.held_back = True  # it could have grown
                self.why[job.id] = "held"
            return True  # changed a moment ago: no growth before it has run a while
        if not job.g_on and not self._may_gather(job, self.lowest):
            self.why[job.id] = "no-gpus"
            return False
        queued = self._failed is not None and jr is None and only is None  # an attempt of the round's queue
        if queued and self.held_back and self._too_short(job):
            self.why[job.id] = "held"  # the restart rule: no change could pay its restart
            return True
        if (job.g_on and job.inp.running and job.g >= max(1, job.min_g) and not self._may_gather(job, self.lowest)
                and self._settled(job, job.best)):
            # a running job that may gather no GPU: the search below would visit no node and end as here, on the
            # allocation as it is; where that does not settle, the attempt goes the long way
            self._skipped_held = False
            self._reindex(job)  # as the search would (nothing was written)
            self.why[job.id] = "held"  # the restart rule: nothing gathered, nothing faster
            return True
        repeat = self._repeat_key(job) if queued else None
        if repeat is not None and repeat in self._failed:
            self.why[job.id] = self._failed[repeat]
            return False
        jr = jr if jr is not None else _Journal()
        mark = len(jr.ops)
        before = (dict(job.g_on), dict(job.c_on), job.best)
        free_before = (self._free_list, self._free_any)  # what the cache of free nodes is again once undone
        if job.g < job.min_g and self._short_of(job):  # under its minimum, with too few GPUs to gather: fail fast
            self.why[job.id] = "no-gpus"
            return False
        self._skipped_held = False
        victims: dict[str, _Job] = {}
        live: dict[str, list] = {}
        """node -> [`_candidates` as they are now, None], for this attempt (`_lowest_slope_over_min`)"""
        floor = self.lowest
        """the lowest (priority, slope) any job may have: the index's (the slopes of when the attempt
        began), or that of a job shrunk since"""
        target = max(job.want_g, job.min_g)  # a guarantee may need more than the curve's knee
        scans, orders = (self._scans, self._orders) if queued else (None, None)
        g0 = job.g
        ran = 0
        """running jobs this attempt shrank: each adds a restart the change must pay"""
        nodes = (self._node_order(job, orders) if only is None else only) if self._may_gather(job, floor) else ()
        if type(nodes) is _Order:
            taken, stop = None, None
            if g0 >= max(1, job.min_g) and job.inp.running:  # a running job's growth the restart rule refuses
                taken, stop = self._takes_free_only(job, nodes, floor, target)
                if stop is None and taken and self._settles_back(job, taken, before[2]):
                    self._reindex(job)  # as the undo would (nothing was written)
                    self.why[job.id] = "held"  # the restart rule: what it would take it gives back, nothing faster
                    return True
            nodes = self._visits(job, nodes, victims)
            if stop is not None:  # the search goes on from the first node where it shrinks a job, read above: the
                for node, take in taken.items():  # free GPUs it takes on its way there, as it would take them
                    self._move(jr, node, None, job, take)
                nodes = dropwhile(stop.__ne__, nodes)  # those before it passed over
        for node in nodes:
            if target - job.g <= 0:
                break
            take = min(self.free_g[node], target - job.g)
            if take > 0:
                self._move(jr, node, None, job, take)
            others = self.on_node[node]
            if not others or (len(others) == 1 and job.id in others):
                continue  # nobody else to shrink here
            if job.g >= job.min_g and not self._beats(job, floor):
                continue  # no job anywhere has a slope (or priority) below the job's own any more: free GPUs only
            if job.g >= job.min_g and self._none_below(node, job, victims):
                continue  # no job here has a slope (or priority) below the job's own: the search would find none
            if victims and scans is not None and node not in live:  # read as the attempt began, but what it shrank
                start = scans.get(node)
                if start is not None:
                    entries = list(start[0])
                    live[node] = [entries, None]
                    for v in victims.values():
                        self._shrunk_on(entries, v, node)
            while target - job.g > 0:  # shrink the lowest slope below the job's own (any while under its minimum)
                victim = self._lowest_slope_over_min(node, job, math.inf if job.g < job.min_g else job.up(),
                                                     None if victims else scans, live)
                if victim is None:
                    break
                self._move(jr, node, victim, job, 1)
                self._shrunk(live, victim, node)
                if victim.id not in victims and victim.inp.running:
                    ran += 1
                    if queued and self._cannot_pay(job, g0, 1 + ran):  # refused, whatever the search gathers
                        self._undo(jr, [job, *victims.values(), victim], mark)
                        self._free_list, self._free_any = free_before
                        self.why[job.id] = "held"
                        return True
                victims[victim.id] = victim
                if self._over_min(victim):
                    floor = min(floor, (victim.inp.priority, victim.down()))
                more, floor = self._more_from(node, job, victim, target, floor, live)
                if more:  # the next steps would take them one at a time from the same job: taken at once
                    self._move(jr, node, victim, job, more)
                    self._shrunk(live, victim, node)
        if (not victims and job.g == g0 and g0 >= max(1, job.min_g) and job.inp.running
                and self._settled(job, before[2])):
            self._reindex(job)  # as the undo below would (nothing was written)
            self.why[job.id] = "held"  # the restart rule, as below: nothing gathered, nothing faster
            return True
        touched = [job, *victims.values()]
        gathered = job.g
        if (victims and job.inp.running and before[0] and gathered >= max(1, job.min_g)
                and self._refused_on(job, job.g_on, before[2], 1 + sum(1 for v in victims.values() if v.inp.running))):
            # what it gathered (GPUs of other jobs among them) settles on a plan whose gain does not pay its restart and
            # those of the running jobs it shrank: the restart rule below (`_worth_it`) would refuse the change; undone
            # as it would be, without settling
            self._undo(jr, touched, mark)
            self._free_list, self._free_any = free_before
            self.why[job.id] = "held"
            return True
        if gathered < max(1, job.min_g) or not self._settle(jr, job):
            self._undo(jr, touched, mark)
            self._free_list, self._free_any = free_before
            self.why[job.id] = ("held" if self._skipped_held else "no-gpus") \
                if gathered < max(1, job.min_g, self._least(job)) else "no-fit"
            if repeat is not None:
                self._failed[repeat] = self.why[job.id]
            return False
        if job.inp.running and before[0] and job.g >= job.min_g and not self._worth_it(job, before[2], victims):
            self._undo(jr, touched, mark)
            self._free_list, self._free_any = free_before
            self.why[job.id] = "held"  # the restart rule: the gain would not pay the restart
            return True
        if job.g < target:
            self.why[job.id] = "held" if self._skipped_held else "no-gpus"
        self.placed[job.id] = job
        self._kept += 1
        for t in touched:
            self._reindex(t)
        if queued:
            self._forget(jr, mark)
        for v in victims.values():
            jr.attr(v, "forced", True)
            jr.attr(v, "reason", "shrunk" if v.g else "preempted")
            jr.attr(v, "detail", {"by": job.id, "slope": f"{v.down():.4g}"})
        if victims and not job.reason:
            jr.attr(job, "detail", {"shrunk": ",".join(sorted(victims)), "slope": f"{job.up():.4g}"})
        return True

    def _more_from(self, node: str, job: _Job, victim: _Job, target: int, floor: tuple[float, float],
                   live: dict[str, list]) -> tuple[int, tuple[float, float]]:
        """(How many GPUs more the search's next steps on `node` would take from `victim`, one at a time, the search's
        `floor` after them), where the victim is the only job there that `_lowest_slope_over_min` would read besides
        the job itself: each next step then takes from it while the job wants more (`target`), the job's slope at the
        GPUs it holds by then passes the victim's (or the victim has a lower priority), and the victim may give up a
        GPU (over its minimum, still on the node). Each step's checks are `_lowest_slope_over_min`'s on one entry, and
        the floor takes the victim's slope after each as the search does. Worked out from the two jobs' tables, nothing
        written: (0, floor) where a check is not one of these (a guarantee, a held victim, the job under its minimum,
        other jobs there), and the search goes on one GPU at a time. On the first three hours of the 100x trace the
        searches of running jobs took 621,577 single GPUs from other jobs, about 16 an attempt."""
        g = job.g
        if (target - g <= 0 or g < job.min_g or victim.privileged or self.fixed_resources or victim.id in self.held
                or node not in victim.g_on):
            return 0, floor
        me, vid = job.id, victim.id
        slot = live.get(node)
        if slot is not None:  # what the next look reads: the attempt's own reads of the node, kept up to date
            for e in slot[0]:
                if e[0] != me and e[0] != vid:
                    return 0, floor
        else:  # else read afresh (`_candidates`): the jobs there listed in the index
            dkey = self._dkey
            for other in self.on_node[node]:
                if other != me and other != vid and other in dkey:
                    return 0, floor
            if vid not in dkey:
                return 0, floor
        prio, vp = job.inp.priority, victim.inp.priority
        if vp > prio:
            return 0, floor
        vmin = victim.min_g
        gv, on, k = victim.g, victim.g_on[node], 0
        while g < target and on > 0 and gv - 1 >= vmin and gv > 0:
            limit = job.up_at(g)
            if not math.isfinite(limit):
                break  # the look then reads every slope: left to it
            if vp == prio and victim.down_at(gv) + EPS >= limit:
                break
            k, g, gv, on = k + 1, g + 1, gv - 1, on - 1
            if gv - 1 >= vmin and gv > 0:  # `_over_min` after the step: its slope down there
                rank = (vp, victim.down_at(gv))
                if rank < floor:  # noqa: PLR1730 (`min` written out: a call costs more, every step)
                    floor = rank
        return k, floor

    def _short_of(self, job: _Job) -> bool:
        """Whether the free GPUs and those the jobs of the index hold over their minimums (less its own) add up to fewer
        than a job under its minimum lacks. Every job of the index holds at least one GPU over its minimum (`_reindex`
        lists no other), so the count stops once it covers what is lacking: a cluster's first round at 8,192 GPUs asks
        this of about 900 guarantees, each over an index of up to 5,000 jobs."""
        lacking = job.min_g - job.g - sum(self.free_g.values())
        if lacking <= 0:
            return False
        jobs, me = self.jobs, job.id
        for _, _, _, vid in self.by_down:
            if vid != me:
                v = jobs[vid]
                lacking -= v.g - v.min_g
                if lacking <= 0:
                    return False
        return True

    def _forget(self, jr: _Journal, mark: int) -> None:
        """After an attempt of the queue is kept: drop what the memos hold of the nodes it changed. Those are the
        nodes its journal wrote (GPUs, CPUs, memory or jobs there; a node a job left among them), and every node
        of a job it changed: its own, those it shrank (their slope and guarantee read their whole placement), and
        every job on a node it wrote (one it took CPUs from changes no attribute of its own)."""
        self._orders = {}
        scans = self._scans
        if not scans:
            return
        jobs, on_node = self.jobs, self.on_node
        stale: set[str] = set()
        changed: set[str] = set()
        for d, key, _ in jr.ops[mark:]:
            if d.__class__ is _Job:  # one of a job's attributes; the dicts written are keyed by node
                changed.add(d.id)
            else:
                stale.add(key)
        for node in stale:
            changed.update(on_node.get(node, ()))
        for vid in changed:
            stale.update(jobs[vid].g_on)
        for node in stale:
            scans.pop(node, None)

    def _repeat_key(self, job: _Job) -> tuple | None:
        """For a job holding nothing, in the round's queue: what its attempt reads of the job itself, with the
        count of attempts kept so far this round. A failed attempt is undone whole, so a job with the same key
        (another of the same kind and request, waiting after it) finds the same state and fails the same way:
        it is answered from `_failed`, the search not run again. None for a job that holds GPUs (its own
        placement is part of what its attempt reads)."""
        if job.g_on:
            return None
        inp = job.inp
        return (self._kept, id(inp.kind), job.cpg, job.ref, job.want_g, job.min_g, job.min_c, job.privileged,
                id(job.request), inp.priority, inp.requested_gpus, inp.requested_cpus, inp.requested_mem_gb)

    def _undo(self, jr: _Journal, touched: list[_Job] = (), mark: int = 0) -> None:
        free_g = self.free_g
        written = [key for d, key, _ in jr.ops[mark:] if d is free_g]
        if written:
            self._free_changed(written)
        if self._room_of is not None:  # the journal's dicts are keyed by node; a job's own attribute counts on its nodes
            for d, key, _ in jr.ops[mark:]:
                self._room_stale.update(d.g_on if d.__class__ is _Job else (key,))
        jr.undo(mark)
        for t in touched:
            self._reindex(t)

    def _settle(self, jr: _Journal, job: _Job) -> bool:
        """GetBestPlan for the placement found, give back what the plan does not use, then CPUs
        and memory (AllocMem). False when no plan fits or the guarantee is not met."""
        cpg = self._cpg_of(job) if job.c_on else job.cpg
        best = self._first_best(job, tuple(job.g_on.values()), max(cpg, job.cpg))
        if best is None:
            return False
        self._trim(jr, job, best.placement)
        if not self._alloc_cpus(jr, job):
            return False
        best = self._last_best(job, best.placement, self._cpg_of(job))
        if best is None or not self._alloc_mem(jr, job, best):
            return False
        jr.attr(job, "best", best)
        return True

    def _last_best(self, job: _Job, placement: tuple[int, ...], cpus_per_gpu: int) -> Best | None:
        """The plan `_settle` ends on once the CPUs are given: the best on `placement` at `cpus_per_gpu`, guarded for a
        guarantee; None where no plan runs there or the guarantee is not met."""
        best = self.book.best(job.inp.kind, placement, cpus_per_gpu)
        if job.privileged:
            best = self._guarded(job, best)
            if not self._meets(job, best):
                return None
        return None if best.plan is None else best

    def _may_gather(self, job: _Job, floor: tuple[float, float]) -> bool:
        """Whether an attempt's search may find a GPU for the job: one free, or one it may take from a job below
        `floor` (any, under its minimum). When it may not, every node would be passed over."""
        return job.g < job.min_g or self._any_free() or self._beats(job, floor)

    def _settled(self, job: _Job, old: Best | None, shape: tuple | None = None,
                 g_on: dict[str, int] | None = None, restarts: int = 1) -> bool:
        """Whether `_settle` on the job's allocation as it is (an attempt that gathered nothing), or on `g_on` (what
        `_trim` keeps of a larger allocation, `_refused_on`, which gives its `shape` with it), would give back nothing
        more, find the CPUs its plan wants on every node (those it holds there, and free ones) and the memory it
        needs, and end with at least its minimum of GPUs on a plan whose gain over `old` (its best as the attempt
        began) does not pay `restarts` restarts (one, or as `_refused_on` counts them): the restart rule (`_worth_it`)
        would then refuse the change, and the attempt be undone whole. Read without writing anything; each check is
        `_settle`'s own, and a case it does not answer for sure (a trim, CPUs to take from another job) is left to
        `_settle` itself.

        What it reads of the plan book (`_settle_memo`) depends only on the placement, the CPUs per GPU, the job's
        request and minimum and its model's version (and, for a guarantee, its reference and the type's margins): a
        job keeps it in its record. What the other jobs leave free (CPUs, memory) and the restart rule (the
        iterations left) are read every time."""
        if old is None or old.throughput <= 0 or not job.c_on:
            return False
        if g_on is None:
            g_on = job.g_on
            _, trims, shape = self._settle_memo(job, tuple(g_on.values()), max(self._cpg_of(job), job.cpg), True)
            if trims:
                return False  # a plan on fewer GPUs: `_trim` would give some back
        if shape is None:
            return False
        want, best, per_node, asked = shape
        c_on, free_c = job.c_on, self.free_c
        for node, g in g_on.items():  # `_alloc_cpus`: what it holds there down to its want, else free CPUs up to it
            have = c_on.get(node, 0)
            if have < g * want and have + free_c[node] < g * want:
                return False  # CPUs to take from another job
        if best.throughput > old.throughput * (1 + 1e-9) and self._pays(job, old, best, restarts):
            return False
        free_m, mem_on, per_gpu = self.free_m, job.mem_on, self.mem_per_gpu_gb
        for node, g in g_on.items():
            if free_m[node] + mem_on.get(node, 0.0) < max(per_node + per_gpu * g, asked * g) - 1e-9:
                return False
        return True

    def _settle_memo(self, job: _Job, place: tuple[int, ...], cpus_per_gpu: int, whole: bool = False) -> list:
        """What settling an allocation of GPUs `place` (in any order) at `cpus_per_gpu` reads of the plan book
        (`_settle_entry`), kept in the job's record (`settled_memo`) under the placement and CPUs per GPU while its
        input, model version, minimum, CPUs per GPU and flag of a guarantee (with its reference, request plan and the
        type's margins) are what they were: a running job asks it round after round, of its own allocation and of
        the larger ones its searches gather. `whole`: the shape is wanted only where `_trim` would give nothing back
        (and is not worked out where it would)."""
        if job.version is None:
            return self._settle_entry(job, place, cpus_per_gpu, whole)
        key = (job.version, job.min_g, job.min_c, job.cpg, self.fixed_resources, self.min_cpus_per_gpu, job.privileged)
        if job.privileged:  # what its guarantee is checked against
            key += (job.ref, job.request, self._margins_key(job.inp.kind))
        memo = job.settled_memo
        if memo is None or memo[0] is not job.inp or memo[1] != key or len(memo[2]) >= 64:  # the input: its request
            memo = job.settled_memo = (job.inp, key, {})
        entry = memo[2].get((place, cpus_per_gpu))
        if entry is None:
            entry = memo[2][(place, cpus_per_gpu)] = self._settle_entry(job, place, cpus_per_gpu, whole)
        elif entry[2] is _UNSET and not (whole and entry[1]):
            entry[2] = self._kept_shape(job, entry[0], place)
        return entry

    def _settle_entry(self, job: _Job, place: tuple[int, ...], cpus_per_gpu: int, whole: bool = False) -> list:
        """[The first plan `_settle` finds on `place` at `cpus_per_gpu`, guarded for a guarantee (None: nothing
        settles); whether `_trim` gives GPUs back; `_kept_shape` (`_UNSET` where `whole` and `_trim` gives some
        back)]."""
        best = self._first_best(job, place, cpus_per_gpu)
        if best is None:
            return [None, False, None]
        trims = best.placement != canonical(place)
        return [best, trims, _UNSET if whole and trims else self._kept_shape(job, best, place)]

    def _kept_shape(self, job: _Job, best: Best, place: tuple[int, ...]) -> tuple | None:
        """`_settle_shape` of what `_trim` keeps of `place` for `best`; None where that is not the plan's placement."""
        uses = best.placement
        kept = canonical(tuple(g if g <= u else u for g, u in zip(canonical(place), uses)))  # `_trim`'s, by size
        return self._settle_shape(job, best) if kept == uses else None

    def _settle_shape(self, job: _Job, best: Best) -> tuple | None:
        """What `_settled` reads of the plan book for the allocation `_trim` keeps for `best` (the first plan
        `_settle` finds, guarded for a guarantee), of GPUs placed as its placement: (the CPUs per GPU it wants, the
        plan it would end on, the host memory per node and the requested memory per GPU it would ask for); None
        where `_settle` would not end there for sure (under the minimum, a guarantee missed)."""
        place = best.placement
        gpus = sum(place)
        if gpus < job.min_g:
            return None  # under its minimum the restart rule is not asked: the change is kept
        want, floor = self._cpu_want(job, place, gpus)
        if want < floor:
            return None
        best = self._last_best(job, place, want if want > 1 else 1)
        if best is None:
            return None
        per_node, asked = self._mem_want(job, best, len(place))
        return want, best, per_node, asked

    def _takes_free_only(self, job: _Job, order: _Order, floor: tuple[float, float],
                         target: int) -> tuple[dict[str, int], str | None]:
        """(The free GPUs an attempt's search over `order` would take (node -> GPUs), None), read without writing
        anything, where it takes only free GPUs and shrinks no job on the way: at each node it reaches, nobody else
        is there, no job anywhere is below the job (`floor`), none there is (`_none_below`), with the job's slope at
        the GPUs it would hold by then, or the search's own look there (`_lowest_slope_over_min`) finds none it may
        shrink.
        That look passes over held jobs as the search does, setting `held_back` and `_skipped_held` where it would;
        the search, run after all, sets them at the same node, and a set `_skipped_held` leaves out of later nodes
        only held jobs it would pass over (`_none_below`). Where the free GPUs fall short, the nodes of the jobs it may
        shrink (the tail, worked out as `_visits` works it out, from the state the attempt began in) are read the same
        way. Where the search would shrink a job: (the free GPUs it takes up to there, those of that node among them,
        the node where it first shrinks one). The search then goes on from that node (`dropwhile`), the flags set as it
        would have set them on its way.

        No tail node has a free GPU (every node with some is in the head), so on the tail the job's GPUs, its slope and
        whether it beats `floor` stay as the head left them: where it does not, no tail node can shrink a job, and where
        it does, only the nodes `_tail_reads` hands out can (on the others `_none_below` holds, and nothing is read)."""
        free_g, on_node, me = self.free_g, self.on_node, job.id
        g = job.g
        taken: dict[str, int] = {}
        for node in order.head():
            take = min(free_g[node], target - g)
            if take > 0:
                taken[node] = take
                g += take
                if target - g <= 0:
                    return taken, None  # the search stops here: it looks for no job to shrink, and visits no other node
            others = on_node[node]
            if not others or (len(others) == 1 and me in others):
                continue
            limit = job.up_at(g)  # at the GPUs it would hold
            if (self._beats(job, floor, limit) and not self._none_below(node, job, {}, limit)
                    and self._lowest_slope_over_min(node, job, limit) is not None):
                return taken, node
        if not order.end:
            return taken, None
        limit = job.up_at(g)
        if not self._beats(job, floor, limit):
            return taken, None
        if order.tail is None:
            order.tail, order.tidx = self._shrinkable(order.end, order.seen())
        for node in self._tail_reads(job, order, limit):
            others = on_node[node]
            if not others or (len(others) == 1 and me in others):
                continue
            if not self._none_below(node, job, {}, limit) and self._lowest_slope_over_min(node, job, limit) is not None:
                return taken, node
        return taken, None

    def _settles_back(self, job: _Job, taken: dict[str, int], old: Best | None) -> bool:
        """Whether `_settle`, after the search took the free GPUs `taken`, would end in the restart rule refusing the
        change: the best plan within the larger allocation, on what `_trim` keeps of it, finds CPUs and memory there,
        and its gain over `old` does not pay a restart; the attempt is then undone whole (`_settled` answers, read
        the same way). What `_trim` keeps may be on nodes the job did not hold (it breaks ties between nodes of as
        many GPUs by name), and on more GPUs than it holds."""
        g_on = dict(job.g_on)
        for node, take in taken.items():
            g_on[node] = g_on.get(node, 0) + take
        return self._refused_on(job, g_on, old)

    def _refused_on(self, job: _Job, g_on: dict[str, int], old: Best | None, restarts: int = 1) -> bool:
        """Whether `_settle` on the allocation `g_on` (node -> GPUs; the job holds CPUs only on the nodes it held
        before the attempt) would end in the restart rule refusing the change, read without writing anything: the
        best plan within it, on what `_trim` keeps of it, finds CPUs and memory there without taking any from another
        job, and its gain over `old` does not pay `restarts` restarts (`_settled`). After a search, the restarts are
        those `_worth_it` counts for the change: the job's own and one for each running job it shrank (settling keeps
        every GPU taken from them, and reclaims no CPUs where `_settled` answers). For free GPUs alone
        (`_settles_back`) one restart."""
        cpg = self._cpg_of(job, g_on) if job.c_on else job.cpg  # over the allocation: no CPUs yet where it gathered
        best, _, shape = self._settle_memo(job, tuple(g_on.values()), max(cpg, job.cpg))
        if best is None:
            return False
        kept: dict[str, int] = {}  # `_trim`: the i-th node by GPUs keeps the i-th of the plan's placement
        for i, node in enumerate(sorted(g_on, key=lambda n: (-g_on[n], n))):
            keep = best.placement[i] if i < len(best.placement) else 0
            g = g_on[node] if g_on[node] <= keep else keep
            if g > 0:
                kept[node] = g
        return self._settled(job, old, shape, kept, restarts)

    def _first_best(self, job: _Job, placement: tuple[int, ...], cpus_per_gpu: int) -> Best | None:
        """`_settle`'s first look at an allocation: the best plan on it or on a trim of it, guarded for a guarantee;
        None where no plan fits or the guarantee is not met."""
        best = self._best_on(job, placement, cpus_per_gpu)
        if best.plan is None:
            return None
        if job.privileged:
            best = self._guarded(job, best, placement)
            if not self._meets(job, best):
                return None
        return best

    def _best_on(self, job: _Job, placement: tuple[int, ...], cpus_per_gpu: int) -> Best:
        """The best plan for an allocation: on it or on what is left after giving back GPUs on its
        smallest nodes; with fixed resources (the job gets exactly its request) on all of it."""
        if self.fixed_resources:
            return self.book.best(job.inp.kind, placement, cpus_per_gpu)
        return self.book.best_within(job.inp.kind, placement, cpus_per_gpu)

    def _trim(self, jr: _Journal, job: _Job, placement: tuple[int, ...]) -> None:
        nodes = sorted(job.g_on, key=lambda n: (-job.g_on[n], n))
        for i, node in enumerate(nodes):
            keep = placement[i] if i < len(placement) else 0
            extra = job.g_on[node] - keep
            if extra > 0:
                self._mark_rooms(job.g_on)  # its GPUs over its minimum count on each of its nodes
                jr.set(self.free_g, node, self.free_g[node] + extra)
                self._free_changed((node,))
                jr.attr(job, "g", job.g - extra)
                jr.set(job.g_on, node, keep if keep > 0 else None)
                if keep <= 0:
                    jr.set(self.free_c, node, self.free_c[node] + job.c_on.get(node, 0))
                    jr.set(job.c_on, node, None)
                    jr.set(self.on_node, node, self.on_node[node] - {job.id})
                    if node in job.mem_on:
                        jr.set(self.free_m, node, self.free_m[node] + job.mem_on[node])
                        jr.set(job.mem_on, node, None)

    def _alloc_cpus(self, jr: _Journal, job: _Job) -> bool:
        """CPUs per GPU: the fewest reaching the top of the job's CPU curve (at least its minimum),
        from free CPUs first, then from jobs on the node whose CPU slope is lower."""
        want, floor = self._cpu_want(job)
        for node in sorted(job.g_on):
            target = job.g_on[node] * want
            have = job.c_on.get(node, 0)
            if have > target:
                jr.set(self.free_c, node, self.free_c[node] + have - target)
                jr.set(job.c_on, node, target)
                continue
            take = min(self.free_c[node], target - have)
            if take > 0:
                jr.set(self.free_c, node, self.free_c[node] - take)
                jr.set(job.c_on, node, have + take)
            short = target - job.c_on.get(node, 0)
            if short > 0:
                self._reclaim_cpus(jr, node, job, short)
            if job.c_on.get(node, 0) < job.g_on[node] * floor:
                return False
        return True

    def _cpu_want(self, job: _Job, place: tuple[int, ...] | None = None, gpus: int | None = None) -> tuple[int, int]:
        """(CPUs per GPU `_alloc_cpus` gives the job on its GPUs now, the fewest it may run on); or on `gpus` GPUs
        placed as `place` (canonical), where it would hold those."""
        kind = job.inp.kind
        if place is None:
            place, gpus = canonical(tuple(job.g_on.values())), job.g
        top = self.book.memo(kind, ("cpu-knee", place), lambda: knee(self.book.cpu_curve(kind, place)))
        want = max(top, self.min_cpus_per_gpu, job.min_c // max(1, gpus) if job.min_c else 0)
        if self.fixed_resources:
            want = max(want, job.cpg)
        floor = max(self.min_cpus_per_gpu, -(-job.min_c // max(1, gpus)) if job.min_c else 0)
        return want, floor

    def _reclaim_cpus(self, jr: _Journal, node: str, job: _Job, short: int) -> None:
        gain_curve = self._cpu_curve(job)
        for vid in sorted(self.on_node[node]):
            if short <= 0:
                return
            v = self.jobs[vid]
            if vid == job.id or not v.g_on.get(node):
                continue
            spare = v.c_on.get(node, 0) - v.g_on[node] * max(self.min_cpus_per_gpu,
                                                            -(-v.min_c // max(1, v.g)) if v.min_c else 0)
            if spare <= 0:
                continue
            v_curve = self._cpu_curve(v)
            loss = slope_down(v_curve, self._cpg_of(v)) if v_curve is not None else 0.0
            gain = slope_up(gain_curve, self._cpg_of(job), len(gain_curve) - 1) if gain_curve is not None else 0.0
            if loss + EPS >= gain and job.c_on.get(node, 0) >= job.g_on[node] * self.min_cpus_per_gpu:
                continue
            give = min(spare, short)
            jr.set(v.c_on, node, v.c_on[node] - give)
            jr.set(job.c_on, node, job.c_on.get(node, 0) + give)
            short -= give
            jr.attr(v, "forced", True)  # undone with the attempt, as everything it did

    def _alloc_mem(self, jr: _Journal, job: _Job, best: Best) -> bool:
        """AllocMem: on each node, the plan's host memory (ZeRO-Offload's optimizer state, split over the
        nodes) and `mem_per_gpu_gb` per GPU, or the owner's requested memory per GPU held, whichever is more."""
        per_node, asked = self._mem_want(job, best)
        for node in sorted(job.g_on):
            want = max(per_node + self.mem_per_gpu_gb * job.g_on[node], asked * job.g_on[node])
            have = job.mem_on.get(node, 0.0)
            if self.free_m[node] + have < want - 1e-9:
                return False
            jr.set(self.free_m, node, self.free_m[node] + have - want)
            jr.set(job.mem_on, node, want)
        for node in [n for n in job.mem_on if n not in job.g_on]:
            jr.set(self.free_m, node, self.free_m[node] + job.mem_on[node])
            jr.set(job.mem_on, node, None)
        return True

    def _mem_want(self, job: _Job, best: Best, nodes: int | None = None) -> tuple[float, float]:
        """(The plan's host memory per node, the owner's requested memory per GPU) that `_alloc_mem` gives, on the
        job's nodes or on `nodes` of them."""
        kind = job.inp.kind
        need = self.book.oracle.host_mem_gb(kind.model, kind.global_batch, best.placement,
                                            best.plan) if best.plan.offload else 0.0
        per_node = need / max(1, len(job.g_on) if nodes is None else nodes)
        return per_node, job.inp.requested_mem_gb / max(1, job.inp.requested_gpus)

    def _too_short(self, job: _Job) -> bool:
        """Whether a running job at its minimum or over cannot gain from any change enough to pay one restart: its work
        left at its current speed is no more than that, or (with a minimum of one GPU at most, which every plan it
        could settle on keeps, so the restart rule is asked) the time it would save at the most speed any allocation
        it could gather gives (`PlanBook.ceiling`, up to the GPUs it asks for) is no more than that. Whatever its
        attempt gathered, the restart rule (`_worth_it`) would refuse the change and the attempt be undone whole. Its
        search is not run once the round is already to be run again (`held_back`): a search that passes over a held job
        sets that, and the rest of what it does is undone. The job is answered `held`, the restart rule; a search that
        gathered GPUs on which no plan settles answered `no-fit` (or `no-gpus`) instead, a case no trace here showed."""
        left = self._work_left_s(job)
        if left is None:
            return False
        if left <= self.restart_cost_s:
            return True
        return job.min_g <= 1 and self._gains_short(job, 1)

    def _gains_short(self, job: _Job, restarts: int) -> bool:
        """Whether the time a running job would save (`_pays`) at the most speed any allocation of up to the GPUs it
        asks for gives is no more than `restarts` restarts cost (or that speed is not over its own): no change its
        search could make pays for them. The speed its allocation has now, grown to those GPUs packed (its curve), is
        read first: where that would pay, so would the most, which is then not worked out."""
        book, kind = self.book, job.inp.kind
        target = max(job.want_g, job.min_g)
        if target > book.max_gpus:
            return False
        old, cost = job.best.throughput, self.restart_cost_s * restarts
        known = float(book.gpu_curve(kind, job.cpg)[target])  # one allocation it could gather: no more than the most
        if known > old * (1 + 1e-9) and self._saved_s(job, old, known) > cost:
            return False
        top = book.ceiling(kind, target, self._node_most)
        if top is None:
            return False
        top *= 1 + 1e-9  # the floor under the times is exact but for rounding
        if job.privileged and job.request is not None and job.request.throughput > top:
            top = job.request.throughput  # a guarantee may end on its own request (`_guarded`)
        return top <= old * (1 + 1e-9) or self._saved_s(job, old, top) <= cost

    def _cannot_pay(self, job: _Job, g0: int, restarts: int) -> bool:
        """Whether a change of a running job that held `g0` GPUs when its attempt in the queue began, costing `restarts`
        restarts (its own, and one for each running job its search has shrunk so far), cannot pay for them, in a round
        already to be run again (`held_back`): its work left at its current speed (`_work_left_s`) is no more than they
        cost, or the time it would save at the most speed any allocation it could gather gives is (`_gains_short`).
        The search then stops, undone, with the answer the restart rule gives at its end (`_refused_on`,
        `_worth_it`): it shrinks no fewer jobs on its way, so no plan it could settle on saves more. Only for a job with
        a minimum of one GPU at most, which every plan it could settle on keeps at its minimum or over (the restart
        rule is asked). As with `_too_short`, a search that would have found no plan to settle on says `held` rather
        than `no-fit` (or `no-gpus`); no trace here showed one."""
        if not self.held_back or job.min_g > 1 or g0 < 1:
            return False
        left = self._work_left_s(job)
        if left is None:
            return False
        return left <= self.restart_cost_s * restarts or self._gains_short(job, restarts)

    def _work_left_s(self, job: _Job) -> float | None:
        """The time a running job at its minimum or over needs to end at its current speed: no change saves more
        (`_pays`), so a change that costs as many restarts or more is refused whatever it gathers. None for a job
        that does not run, or at no known speed."""
        old, inp = job.best, job.inp
        if not inp.running or job.g < max(1, job.min_g) or old is None or not old.throughput > 0:
            return None
        return inp.remaining_iters * (inp.kind.global_batch / old.throughput)

    def _worth_it(self, job: _Job, old: Best | None, victims: dict[str, _Job]) -> bool:
        """The restart rule for a running job's own change."""
        if old is None or old.throughput <= 0 or job.best is None:
            return True
        if job.best.throughput <= old.throughput * (1 + 1e-9):
            return False
        return self._pays(job, old, job.best, 1 + sum(1 for v in victims.values() if v.inp.running))

    def _pays(self, job: _Job, old: Best, new: Best, restarts: int) -> bool:
        """Whether the time a running job saves over its remaining iterations, going from `old` to the faster `new`,
        exceeds the cost of `restarts` restarts."""
        return self._saved_s(job, old.throughput, new.throughput) > self.restart_cost_s * restarts

    @staticmethod
    def _saved_s(job: _Job, old: float, new: float) -> float:
        """The seconds a running job saves over its remaining iterations going from `old` samples/s to `new`."""
        gbs = job.inp.kind.global_batch
        return job.inp.remaining_iters * (gbs / old - gbs / new)
