"""The Rubick engine's view of the nodes during a round: CPUs per GPU and their slope, the nodes with free GPUs, the
order an attempt visits the nodes in, the rooms, the slope index of the jobs it may shrink (`by_down`, and the
keys listed under each node) and which job on a node is shrunk next."""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from typing import Iterable, Iterator

import numpy as np

from .curves import slope_up
from .plans import canonical
from .records import EPS, _entry, _Job, _Order

_INF = math.inf

_SKIP_FROM = 96
"""a walk over a tail of more nodes than this passes those where the search would do nothing (`_visits`); on a
shorter one, working out which to pass costs more than reading each (rounds on 80 nodes ran faster walking them)"""
_MARK_BY_NAME = 16
"""`_mark_in_tail` finds up to this many nodes by bisection in the tail's names, more in its arrays (a bisection and
a write cost about half a microsecond a node, numpy's four calls about eight microseconds whatever the count)"""
_WITHIN_KEPT = 256
"""the most prefixes' nodes `_shrinkable_listed` keeps (`_within`) before it forgets them all"""

_LESS_ONE: dict[tuple[tuple[int, ...], int | None], tuple[int, ...]] = {}
"""(a placement's GPUs per node in any order, those of one of its nodes) -> the placement with one GPU less on that
node, canonical (`_keeps_guarantee`): a privileged job's placement and a count are all the answer depends on (one
occurrence of the count goes one down; None, a node it does not hold: none does), and reading it here costs a fraction
of working it out node by node (12,000 asks in a cluster's first round at 8,192 GPUs)"""
_LESS_ONE_KEPT = 1 << 16


def _free_keys_of(free_g: dict[str, int], pos: dict[str, int]) -> tuple[list[tuple[int, int, str]],
                                                                         dict[str, tuple[int, int, str]]]:
    """The free nodes' keys (-free GPUs, position in the nodes' order, node), sorted, and node -> its key: of every
    node with a free GPU in `free_g`."""
    keys = sorted([(-g, pos[n], n) for n, g in free_g.items() if g > 0])
    return keys, {k[2]: k for k in keys}


def _put_free(keys: list[tuple[int, int, str]], of: dict[str, tuple[int, int, str]], node: str, g: int,
              pos: dict[str, int]) -> None:
    """Put `node`, with `g` free GPUs now, in its place among the free nodes' keys (`keys`: (-free GPUs, position in the
    nodes' order, node), sorted; `of`: node -> its key there): its old key out, a new one in where it has any."""
    old = of.get(node)
    if old is not None:
        if old[0] == -g:
            return
        del keys[bisect.bisect_left(keys, old)]
        del of[node]
    if g > 0:
        key = of[node] = (-g, pos[node], node)
        bisect.insort(keys, key)


def _signs_differ(a: float, b: float) -> bool:
    """Whether two slopes that compare equal are 0.0 and -0.0 (a key is kept only where it is the same in every part)."""
    return a == 0.0 and math.copysign(1.0, a) != math.copysign(1.0, b)


class _IndexBase:
    """The slope index a round works on (`_NodeIndex._index_all`), kept as the round leaves it for the next round to
    patch. `nidx` is the layout's node -> index its arrays are by; `held` the ids listed as held (in `node_keys`, not in
    `unheld_keys`)."""

    __slots__ = ("by_down", "dkey", "dnodes", "held", "lo_o", "lo_p", "lo_s", "nidx", "node_keys", "un_p", "un_s",
                 "unheld_keys")

    def __init__(self, nidx: dict[str, int], lo_p: np.ndarray, lo_s: np.ndarray, lo_o: np.ndarray, un_p: np.ndarray,
                 un_s: np.ndarray) -> None:
        self.nidx, self.lo_p, self.lo_s, self.lo_o, self.un_p, self.un_s = nidx, lo_p, lo_s, lo_o, un_p, un_s
        self.by_down: list[tuple] = []
        self.dkey: dict[str, tuple] = {}
        self.dnodes: dict[str, tuple[str, ...]] = {}
        self.node_keys: dict[str, list[tuple]] = defaultdict(list)
        self.unheld_keys: dict[str, list[tuple]] = {}
        self.held: set[str] = set()


class _NodeIndex:
    """Part of `RubickEngine`: what an attempt reads of the nodes and the index of the jobs it may shrink."""

    # --- CPUs ---------------------------------------------------------------------------------
    def _cpg_of(self, job: _Job, g_on: dict[str, int] | None = None) -> int:
        """The fewest CPUs per GPU the job holds on the nodes of an allocation, at least one: its own (`g_on` None), or
        `g_on` (node -> GPUs), where it may hold no CPUs yet on some nodes; `job.cpg` where the allocation is empty."""
        c_on, low = job.c_on, None
        for n, g in (job.g_on if g_on is None else g_on).items():
            if g > 0:
                r = c_on.get(n, 0) // g
                if low is None or r < low:
                    low = r
        return job.cpg if low is None else (low if low > 1 else 1)

    def _cpu_curve(self, job: _Job) -> np.ndarray:
        return self.book.cpu_curve(job.inp.kind, tuple(job.g_on.values())) / job.ref if job.ref > 0 else None

    def _cpu_slope_up(self, job: _Job) -> float:
        if not job.inp.kind.offload or job.ref <= 0:
            return 0.0  # only ZeRO-Offload runs anything on the CPUs: a flat curve
        if job.touched or job.placed is None:
            place, cpg = tuple(job.g_on.values()), self._cpg_of(job)
        else:  # it holds what it was placed on as the round began
            place, cpg = job.placed[0], job.placed[1]
        memo = job.cpu_memo  # a running job's, most often the same as last round's
        if memo is not None and memo[0] == place and memo[1] == cpg and memo[2] is job.version and memo[3] == job.ref:
            return memo[4]

        def slope() -> float:
            curve = self._cpu_curve(job)
            return slope_up(curve, cpg, len(curve) - 1)
        value = self.book.memo(job.inp.kind, ("cpu-up", canonical(place), cpg, job.ref), slope)
        job.cpu_memo = (place, cpg, job.version, job.ref, value)
        return value

    # --- ScheduleJob -------------------------------------------------------------------------
    def _free_nodes(self) -> list[str]:
        """Nodes with free GPUs, most free first, ties in the nodes' order (cached until free GPUs change)."""
        if self._free_list is None:
            self._free_list = [k[2] for k in self._free_index()]
        return self._free_list

    def _free_index(self) -> list[tuple[int, int, str]]:
        """`_free_keys`, up to date: made whole once a round (or copied from the kept placement's, `_place_current`),
        then only the nodes written since put in place again."""
        keys = self._free_keys
        if keys is None:
            keys, self._free_key_of = _free_keys_of(self.free_g, self._pos)
            self._free_keys = keys
            self._free_dirty.clear()
        elif self._free_dirty:
            of, free_g, pos = self._free_key_of, self.free_g, self._pos
            for n in self._free_dirty:
                _put_free(keys, of, n, free_g[n], pos)
            self._free_dirty.clear()
        return keys

    def _any_free(self) -> bool:
        """Whether some node has a free GPU (`_free_nodes()` is not empty), without listing them (cached the same
        way)."""
        if self._free_any is None:
            self._free_any = bool(self._free_list) if self._free_list is not None else bool(self._free_index())
        return self._free_any

    def _free_changed(self, nodes: Iterable[str]) -> None:
        """The free GPUs of `nodes` were written."""
        self._free_list = self._free_any = None
        self._free_dirty.update(nodes)

    def _node_order(self, job: _Job, memo: dict | None = None) -> Iterable[str]:
        """Nodes to visit: the job's own, then those with free GPUs, then those holding a job with a
        lower slope than its own. Under its own minimum: its own, then every node by the GPUs it
        could get there, most first.

        `memo` (an attempt in the round's queue): the order of a job holding nothing is kept by the end of the
        index's prefix it may shrink, for the next such attempts until one is kept (the free nodes and the
        prefix's nodes are the same until then: a failed attempt is undone whole)."""
        if memo is not None and not job.g_on and job.g >= job.min_g:
            if self._beats(job, self.lowest):
                prio, up = job.inp.priority, job.up()
                end = bisect.bisect_left(self.by_down, True,
                                         key=lambda k: not (k[0] < prio or (k[0] == prio and k[1] + EPS < up)))
            else:
                end = -1
            order = memo.get(end)
            if order is None:
                order = memo[end] = self._node_order(job)
            return order
        mine = sorted(job.g_on, key=lambda n: (-job.g_on[n], n))
        if job.g < job.min_g:  # a guarantee to meet: pack it on the nodes with the most GPUs free or reclaimable,
            # those no other guarantee holds first (a guarantee's GPUs over its minimum come from one pool,
            # so counting them on every node it holds would scatter the job)
            return self._by_room(job, mine, set(mine))
        end = 0
        if self._beats(job, self.lowest):
            # the jobs it may shrink are a prefix of the index (lowest priority, then slope, first): find its end by
            # bisection with the same test; the nodes they hold (less its own and the free ones) are the tail
            prio, up = job.inp.priority, job.up()
            end = bisect.bisect_left(self.by_down, True,
                                     key=lambda k: not (k[0] < prio or (k[0] == prio and k[1] + EPS < up)))
        return _Order(mine, self._free_nodes(), end)

    def _shrinkable(self, end: int, seen: set[str]) -> tuple[list[str], np.ndarray]:
        """The nodes not in `seen` where a job of the index's prefix `by_down[:end]` holds GPUs, by name, and their
        indices in `_by_name`. A short prefix: its jobs' nodes. A long one: the nodes whose lowest key listed in
        `_node_keys` is within it, from the lowest keys' arrays (the few whose priority and slope tie the prefix's
        last key's, or whose slope is not a number, compared whole). At the start of an attempt every job of the index
        is listed under the nodes it holds, as `tests/policy/test_round_memos.py` checks.

        Short means under `24 + nodes / 20` jobs: reading the jobs costs about a third of a microsecond each, the
        arrays about 8 us and a fiftieth of a microsecond a node (measured on the 100x trace, 800 nodes: the jobs'
        way takes 39-44 us a call at 64-255 jobs, the arrays' 16-22 us)."""
        if end < 24 + len(self.order) // 20:
            jobs = self.jobs
            names = sorted(set().union(*(jobs[k[3]].g_on for k in self.by_down[:end])) - seen)
            return names, np.fromiter(map(self._nidx.__getitem__, names), np.intp, len(names))
        return self._shrinkable_listed(end, seen)

    def _shrinkable_listed(self, end: int, seen: set[str]) -> tuple[list[str], np.ndarray]:
        """`_shrinkable` for a long prefix, from the lowest keys listed under the nodes. Which nodes' lowest keys are
        within the prefix depends on its last key and on the lowest keys alone: it is kept by that key (`_within`)
        for the round, and a node's entry in each prefix kept is written again when its lowest key changes
        (`_low_changed`): most attempts of a round ask it again (on the 100x trace's first hours, 94 of 100 calls),
        and a kept attempt changes the lowest keys of a few nodes only."""
        bound = self.by_down[end - 1]
        within = self._within.get(bound)
        if within is None:
            node_keys, p, s, o = self._node_keys, self._lo_p, self._lo_s, self._lo_o
            bp, bs, bo = bound[0], bound[1], bound[2]
            same_p = p == bp
            within = (p < bp) | (same_p & (s < bs))
            # the priority and slope of the bound's: the submission order tells, but a tie of it
            tie = same_p & (s == bs)
            within |= tie & (o < bo)
            for i in np.flatnonzero((tie & (o == bo)) | (same_p & ~(s < bs) & ~(s > bs) & ~tie)).tolist():
                within[i] = node_keys[self._by_name[i]][0] <= bound  # a tie of the order too, or a slope not a number
            if len(self._within) >= _WITHIN_KEPT:
                self._within.clear()
            self._within[bound] = within
        if seen:
            within = within.copy()
            within[np.fromiter(map(self._nidx.__getitem__, seen), np.intp, len(seen))] = False
        idx = np.flatnonzero(within)
        return self._names[idx].tolist(), idx

    def _visits(self, job: _Job, order: _Order, victims: dict[str, _Job]) -> Iterator[str]:
        """The nodes of `order` an attempt's search reads, in order. Its head (the job's own nodes and those with free
        GPUs as the attempt began) whole. Its tail (the nodes of jobs it may shrink) is worked out when the search
        reaches it, as it would have been when the attempt began: the search has changed only nodes of the head by
        then (the jobs it shrank left none of the tail), and the keys listed under the nodes stay as they are until
        the attempt ends. A short tail whole; of a long one, while the job is at its minimum or over and its slope
        up is finite, only a node whose lowest key listed in `_node_keys` has a priority, or slope, below the job's
        own, one where a job it shrank holds GPUs, and one its own key is listed under: on any other the search
        would do nothing (`_none_below`; no GPU is free there, as none was when the attempt began). Once the search
        has passed over a held job, of a tail short or long, the same with the lowest keys of the jobs not held
        (`_unheld_keys`): `_none_below` then leaves the held ones out. What it reads is worked out when the search
        asks for the next node: the job's GPUs and slope change as it takes them."""
        yield from order.head()
        if not order.end:
            return
        if order.tail is None:
            order.tail, order.tidx = self._shrinkable(order.end, order.seen())
        tail, tidx = order.tail, order.tidx
        short = len(tail) <= _SKIP_FROM
        n, j = len(tidx), 0
        cand = seen_at = None
        lows: dict[bool, tuple[np.ndarray | None, np.ndarray | None, np.ndarray]] = {}
        """held left out or not -> (the tail's lowest keys of a priority below the job's, of its priority: both None
        where every one is of its priority; their slopes plus `EPS`), worked out once: only the slope limit moves"""
        while j < n:
            unheld = self._skipped_held
            if job.g < job.min_g or not math.isfinite(limit := job.up()) or (short and not unheld):
                yield tail[j]
                j, seen_at = j + 1, None
                continue
            state = (limit, len(victims), unheld)
            if state != seen_at:  # else the positions to visit are as they were
                low = lows.get(unheld)
                if low is None:
                    low_p, low_s = ((self._un_p[tidx], self._un_s[tidx]) if unheld
                                    else (self._lo_p[tidx], self._lo_s[tidx]))
                    prio = job.inp.priority
                    same = low_p == prio  # all of it: `count_nonzero` costs a fraction of `all`'s Python wrapper
                    low = lows[unheld] = ((None, None, low_s + EPS) if np.count_nonzero(same) == len(same)
                                          else (low_p < prio, same, low_s + EPS))
                below, same, slope = low
                # a key below the job's: of a lower priority, or of its own and a slope below its own
                mask = slope < limit if below is None else below | (same & (slope < limit))
                extra = [*self._dnodes.get(job.id, ())]
                for v in victims.values():
                    extra.extend(v.g_on)
                self._mark_in_tail(mask, tail, tidx, extra)
                cand, seen_at = mask, state
            # the next position to visit: the first of `cand` at or after `j` (argmax of booleans stops at the first
            # true one; 0 where there is none, told apart by reading it)
            j += int(cand[j:].argmax())
            if not cand[j]:
                return
            yield tail[j]
            j += 1

    def _tail_reads(self, job: _Job, order: _Order, limit: float) -> Iterator[str]:
        """The nodes of `order`'s tail (worked out) on which `_none_below(node, job, {}, limit)` may not hold, in
        order: `_visits`'s walk of the tail at a slope that does not move and with no job shrunk (`_takes_free_only`).
        A short tail, or a slope that is not finite, whole (a short one until a held job was passed over); else the
        nodes whose lowest key listed, of the jobs not held once `_skipped_held` (`_un_*`, else `_lo_*`), has a
        priority, or slope, below the job's, and those its own key is listed under."""
        tail, tidx = order.tail, order.tidx
        n, j = len(tidx), 0
        if not math.isfinite(limit):
            yield from tail
            return
        short = len(tail) <= _SKIP_FROM
        reads: dict[bool, list[int]] = {}
        """`_skipped_held` -> the positions in the tail to read, ascending: the slope does not move, so they are worked
        out once for each (a bisection then finds the next, where numpy's `argmax` would cost a call a node read)"""
        while j < n:
            unheld = self._skipped_held
            if short and not unheld:
                yield tail[j]
                j += 1
                continue
            at = reads.get(unheld)
            if at is None:
                low_p, low_s = ((self._un_p[tidx], self._un_s[tidx]) if unheld
                                else (self._lo_p[tidx], self._lo_s[tidx]))
                prio, slope = job.inp.priority, low_s + EPS
                same = low_p == prio  # all of it: `count_nonzero` costs a fraction of `all`'s Python wrapper
                mask = slope < limit if np.count_nonzero(same) == len(same) else (
                    (low_p < prio) | (same & (slope < limit)))
                self._mark_in_tail(mask, tail, tidx, self._dnodes.get(job.id, ()))
                at = reads[unheld] = np.flatnonzero(mask).tolist()
            k = bisect.bisect_left(at, j)  # the first position at or after `j`
            if k == len(at):
                return
            j = at[k]
            yield tail[j]
            j += 1

    def _mark_in_tail(self, mask: np.ndarray, tail: list[str], tidx: np.ndarray, nodes) -> None:
        """Set `mask` (one entry per node of a tail: `tail` its names, sorted, `tidx` their indices in `_by_name`,
        ascending) at those of `nodes` that are in the tail (`_visits`, `_tail_reads`: nodes to read whatever their
        lowest keys say). A few nodes are looked up by bisection in the names, the way that costs least: a job holds
        GPUs on one node or a few most often, and each of numpy's calls costs microseconds whatever its size; many
        (a job spread wide) in the arrays."""
        if len(nodes) <= _MARK_BY_NAME:
            n, find = len(tail), bisect.bisect_left
            for node in nodes:
                at = find(tail, node)
                if at < n and tail[at] == node:
                    mask[at] = True
        elif nodes:
            at = np.fromiter(map(self._nidx.__getitem__, nodes), np.intp, len(nodes))
            pos = np.searchsorted(tidx, at)
            inside = pos < len(tidx)
            pos, at = pos[inside], at[inside]
            mask[pos[tidx[pos] == at]] = True

    def _by_room(self, job: _Job, mine: list[str], seen: set[str]):
        """`mine`, then the other nodes where the job could get GPUs, most first (`_room`). The nodes' rooms are
        worked out for every node at the round's first call, then kept in order (`_room_keys`); a later call works
        out again only those of the nodes marked since (`_mark_rooms`). The nodes are handed out in that order as
        the attempt reads them, often only the first few of thousands. A job's own nodes are in `seen`: on every
        other node the job holds nothing, so what a node's room counts is the same for every job."""
        of = self._room_of
        if of is None:
            of = self._room_of = {n: self._room(n) for n in self.order}
            self._room_keys = sorted(e for e in of.values() if e is not None)
            self._room_stale = set()
        elif self._room_stale:
            keys = self._room_keys
            for n in self._room_stale:
                old, new = of[n], self._room(n)
                if old == new:
                    continue
                if old is not None:
                    del keys[bisect.bisect_left(keys, old)]
                if new is not None:
                    bisect.insort(keys, new)
                of[n] = new
            self._room_stale.clear()
        keys = self._room_keys[:]  # as the attempt begins

        def order():
            yield from mine
            for e in keys:
                if e[3] not in seen:
                    yield e[3]
        return order()

    def _room(self, n: str) -> tuple[int, int, int, str] | None:
        """(-room, -soft room, -free GPUs, node), or None where there is no room: the node's free GPUs and those the
        jobs of the index there hold over their own minimum; and how many of them are free or held by jobs without
        a guarantee (a guarantee's GPUs over its minimum come from one pool: each node counts up to that pool)."""
        out = soft = free = self.free_g[n]
        dkey, jobs = self._dkey, self.jobs
        for vid in self.on_node[n]:
            if vid in dkey:
                v = jobs[vid]
                take, over = v.g_on.get(n, 0), v.g - v.min_g
                if over < take:
                    take = over
                out += take
                soft += 0 if v.privileged else take
        return (-out, -soft, -free, n) if out > 0 else None

    def _mark_rooms(self, nodes: Iterable[str]) -> None:
        """Nodes whose room (`_room`) may have changed: free GPUs, the jobs there, or a job there that changed. Kept
        only while the round has worked the rooms out (`_by_room`)."""
        if self._room_of is not None:
            self._room_stale.update(nodes)

    def _index_all(self) -> None:
        """`_reindex` of every job holding GPUs as the round begins, in one go. The index as the last round left it is
        kept (`_index_base`): the keys that changed since are taken out of it and put in again (`_patch_base`), else it
        is made whole (`_base_of`: the keys gathered, then each list sorted once); the round then works on it
        (`_reindex`), and leaves it for the next round to patch (a round cut short by an error drops it): copying it
        for each round cost 2.3% of the whole 100x trace. At 800 nodes, most rounds change a few of the jobs listed, on
        a few nodes each, where the whole index lists each job's key on every node it holds GPUs on. The lists are
        sorted and the keys unique, so the order they were made in makes no difference, but for a slope that is not a
        number: it compares neither below nor above any other, and where one is, the jobs are indexed one by one into
        a new, empty index, as `_reindex` would (and nothing is kept)."""
        gathered, unordered = [], False
        for job in self._awake:
            if job.carried and not job.privileged and not job.index_priv:  # as the last round began: the same key,
                key = job.index_key  # on the same nodes
            elif job.g > 0 and self._over_min(job) and (not job.privileged or self._keeps_guarantee(
                    job, min(job.g_on, key=lambda n: (job.g_on[n], n)))):
                key = job.index_key = (job.inp.priority, job.down(), -job.inp.order, job.id)
                job.index_nodes = tuple(job.g_on)
                job.index_priv = job.privileged
            else:
                job.index_key = None
                job.index_priv = job.privileged
                continue
            if key is not None:
                unordered = unordered or key[1] != key[1]
                gathered.append((job, key))
        if unordered:
            self._index_base = None
            self._wake_dormant()  # indexed in turn, as the jobs awake are
            for job in self._awake:
                if job.g:
                    self._reindex(job)
            return
        base = getattr(self, "_index_base", None)
        if base is None or base.nidx is not self._nidx or not self._patch_base(base, gathered):
            gathered += [(job, job.index_key) for job in self._dormant.values() if job.index_key is not None]
            base = self._index_base = self._base_of(gathered)
        # the round works on the kept index itself (`_reindex` writes it): the next round patches it from where this
        # one leaves it
        self.by_down, self._dkey, self._dnodes = base.by_down, base.dkey, base.dnodes
        self._node_keys, self._unheld_keys, self._listed_held = base.node_keys, base.unheld_keys, base.held
        self._lo_p, self._lo_s, self._lo_o = base.lo_p, base.lo_s, base.lo_o
        self._un_p, self._un_s = base.un_p, base.un_s
        self._within = {}

    def _base_of(self, gathered: list[tuple[_Job, tuple]]) -> _IndexBase:
        """The index of the jobs `gathered` (job, key), made whole: the keys, then each list sorted once."""
        held, base = self.held, _IndexBase(self._nidx, self._lo_p.copy(), self._lo_s.copy(), self._lo_o.copy(),
                                           self._un_p.copy(), self._un_s.copy())
        node_keys, unheld_keys, dkey, dnodes, held_ids = (base.node_keys, base.unheld_keys, base.dkey, base.dnodes,
                                                          base.held)
        keys, listed = [], set()
        for job, key in gathered:
            keys.append(key)
            dkey[job.id] = key
            nodes = dnodes[job.id] = job.index_nodes
            listed.update(nodes)
            if job.id in held:
                held_ids.add(job.id)
                for n in nodes:
                    node_keys[n].append(key)
            else:
                for n in nodes:
                    node_keys[n].append(key)
                    unheld_keys.setdefault(n, []).append(key)
        keys.sort()
        base.by_down = keys
        nidx, lo_p, lo_s, lo_o, un_p, un_s = self._nidx, base.lo_p, base.lo_s, base.lo_o, base.un_p, base.un_s
        for n in listed:
            i, ks = nidx[n], node_keys[n]
            ks.sort()
            lo_p[i], lo_s[i], lo_o[i] = ks[0][0], ks[0][1], ks[0][2]
            ks = unheld_keys.get(n)
            if ks:
                ks.sort()
                un_p[i], un_s[i] = ks[0][0], ks[0][1]
        return base

    def _patch_base(self, base: _IndexBase, gathered: list[tuple[_Job, tuple]]) -> bool:
        """Make the last round's index (`_index_base`, as that round left it) this round's: the keys of the jobs no
        longer listed, or listed otherwise (another key, other nodes, held or not), taken out; theirs now put in (a
        key made again with the same parts stays listed as it is). The lists stay sorted and the keys are unique, so
        the result is the index `_base_of` makes whole. False, touching nothing, where more keys go and come than are
        listed now (made whole then: as fast)."""
        held, dkey, dnodes, held_ids = self.held, base.dkey, base.dnodes, base.held
        changed, ids = [], set(self._dormant)  # a dormant record is listed as it is (`_keep_dormant`)
        for i, (job, key) in enumerate(gathered):
            jid = job.id
            ids.add(jid)
            was = dkey.get(jid)  # a key made again with the same parts stays listed as it is
            same = was is key or (was is not None and was == key and not _signs_differ(was[1], key[1]))
            if same and was is not key:
                # the record takes the key as listed: a dormant record is kept while the index lists its key itself
                # (`_keep_dormant`), and one made again with an equal key would otherwise be made again every round
                # (`gathered` too, in case the index is made whole from it after all)
                job.index_key = key = was
                gathered[i] = (job, key)
            if not same or dnodes[jid] != job.index_nodes or (jid in held) != (jid in held_ids):
                changed.append((job, key))
        gone = list(dkey.keys() - ids)
        gone += [job.id for job, _ in changed if job.id in dkey]
        if len(gone) + len(changed) > len(gathered) + len(self._dormant):
            return False
        by_down, node_keys, unheld_keys, bisect_left, insort = (base.by_down, base.node_keys, base.unheld_keys,
                                                                bisect.bisect_left, bisect.insort)
        nodes_changed = set()
        for jid in gone:
            key, nodes = dkey.pop(jid), dnodes.pop(jid)
            del by_down[bisect_left(by_down, key)]
            nodes_changed.update(nodes)
            was_held = jid in held_ids
            held_ids.discard(jid)
            for n in nodes:
                ks = node_keys[n]
                del ks[bisect_left(ks, key)]
                if not ks:
                    del node_keys[n]
                if not was_held:
                    ks = unheld_keys[n]
                    del ks[bisect_left(ks, key)]
                    if not ks:
                        del unheld_keys[n]
        for job, key in changed:
            jid = job.id
            dkey[jid] = key
            nodes = dnodes[jid] = job.index_nodes
            insort(by_down, key)
            nodes_changed.update(nodes)
            is_held = jid in held
            if is_held:
                held_ids.add(jid)
            for n in nodes:
                insort(node_keys[n], key)
                if not is_held:
                    insort(unheld_keys.setdefault(n, []), key)
        nidx, lo_p, lo_s, lo_o, un_p, un_s, inf = (self._nidx, base.lo_p, base.lo_s, base.lo_o, base.un_p, base.un_s,
                                                   math.inf)
        for n in nodes_changed:
            i, ks = nidx[n], node_keys.get(n)
            lo_p[i], lo_s[i], lo_o[i] = (ks[0][0], ks[0][1], ks[0][2]) if ks else (inf, inf, inf)
            ks = unheld_keys.get(n)
            un_p[i], un_s[i] = (ks[0][0], ks[0][1]) if ks else (inf, inf)
        return True

    def _reindex(self, job: _Job) -> None:
        if self._room_of is not None:  # its GPUs over its minimum, its guarantee, whether it is in the index
            self._room_stale.update(job.g_on)
            self._room_stale.update(self._dnodes.get(job.id, ()))
        old = self._dkey.get(job.id)
        if job.g > 0 and self._over_min(job) and (not job.privileged or self._keeps_guarantee(
                job, min(job.g_on, key=lambda n: (job.g_on[n], n)))):
            key = (job.inp.priority, job.down(), -job.inp.order, job.id)
        else:
            key = None
        if key == old and (key is None or self._dnodes[job.id] == tuple(job.g_on)):
            return  # listed as it is already (an attempt undone leaves most jobs so)
        unheld = self._unheld_keys if job.id not in self.held else None
        node_keys = self._node_keys
        if old is not None:
            del self._dkey[job.id]
            del self.by_down[bisect.bisect_left(self.by_down, old)]
            self._listed_held.discard(job.id)
            for node in self._dnodes.pop(job.id):
                self._unlist(node_keys[node], old, node, self._lo_p, self._lo_s, self._lo_o)
                if unheld is not None:
                    self._unlist(unheld[node], old, node, self._un_p, self._un_s)
        if key is not None:
            bisect.insort(self.by_down, key)
            self._dkey[job.id] = key
            if unheld is None:
                self._listed_held.add(job.id)
            nodes = self._dnodes[job.id] = tuple(job.g_on)
            for node in nodes:
                self._enlist(node_keys[node], key, node, self._lo_p, self._lo_s, self._lo_o)
                if unheld is not None:
                    self._enlist(unheld.setdefault(node, []), key, node, self._un_p, self._un_s)

    def _enlist(self, keys: list[tuple], key: tuple, node: str, p: np.ndarray, s: np.ndarray,
                o: np.ndarray | None = None) -> None:
        """Put `key` in a node's sorted `keys`, and the node's lowest in `p`, `s` (and `o`) where it becomes the
        lowest."""
        at = bisect.bisect_left(keys, key)
        keys.insert(at, key)
        if not at:
            self._low_changed(node, keys, p, s, o)

    def _unlist(self, keys: list[tuple], key: tuple, node: str, p: np.ndarray, s: np.ndarray,
                o: np.ndarray | None = None) -> None:
        """Take `key` out of a node's sorted `keys`, and the node's lowest in `p`, `s` (and `o`) where it was the
        lowest."""
        at = bisect.bisect_left(keys, key)
        del keys[at]
        if not at:
            self._low_changed(node, keys, p, s, o)

    def _low_changed(self, node: str, keys: list[tuple[int, float, int, str]], p: np.ndarray, s: np.ndarray,
                     o: np.ndarray | None) -> None:
        i = self._nidx[node]
        low = keys[0] if keys else None
        if o is not None and self._within:  # a lowest key of `_node_keys`: the node in what `_shrinkable_listed` kept,
            for bound, within in self._within.items():  # the whole keys compared, as working it out compares a tie or
                within[i] = low is not None and low <= bound  # a slope not a number; with no key, within none
        if low is not None:
            p[i], s[i] = low[0], low[1]
            if o is not None:
                o[i] = low[2]
        else:
            p[i] = s[i] = math.inf
            if o is not None:
                o[i] = math.inf

    @property
    def lowest(self) -> tuple[float, float]:
        """(priority, slope) of the job that gives up a GPU most cheaply: the lowest priority, then slope."""
        return self.by_down[0][:2] if self.by_down else (math.inf, math.inf)

    @staticmethod
    def _beats(job: _Job, rank: tuple[float, float], limit: float | None = None) -> bool:
        """Whether `job` may take a GPU from a job of `rank` (priority, slope): a lower priority, or the same
        priority and a slope below the job's own (Algorithm 1); `limit`: its slope, where not the one it has now."""
        return rank[0] < job.inp.priority or (rank[0] == job.inp.priority
                                              and rank[1] + EPS < (job.up() if limit is None else limit))

    def _over_min(self, victim: _Job) -> bool:
        if victim.g - 1 < victim.min_g or victim.g <= 0:
            return False
        return not self.fixed_resources

    def _lowest_slope_over_min(self, node: str, job: _Job, limit: float, memo: dict | None = None,
                               live: dict | None = None) -> _Job | None:
        """The job on `node` with the lowest priority, then slope, that `job` may take a GPU from (a slope
        below `limit` among its own priority, any slope below it) and that may give up a GPU there.

        `memo` (an attempt in the round's queue that has shrunk no job yet): what the search reads of the jobs on
        the node (`_candidates`), kept for the next attempts; a kept attempt drops the nodes it changed
        (`_forget`). `live` (the attempt's own): what it reads of the jobs on the nodes it visited as they are now,
        kept up to date as it shrinks them (`_shrunk`): a search takes one GPU at a time, and read them again at
        each."""
        prio = job.inp.priority
        # in id order: the victim chosen does not depend on the order (its key decides), but whether a held job
        # was passed over (`held_back`, the pending reason `held`) must not depend on a set's hash order
        slot = memo.get(node) if memo is not None else None
        if slot is None and live is not None:
            slot = live.get(node)
        if slot is None:
            slot = [self._candidates(node), None]
            if memo is not None and job.id not in self.on_node[node]:
                memo[node] = slot  # read of jobs as they were when the attempt began (it holds nothing here)
            elif live is not None:
                live[node] = slot
        entries = slot[0]
        finite = math.isfinite(limit)
        if memo is not None and finite and not job.g_on and job.g >= job.min_g:
            # a job that held nothing when its attempt began (it is none of the entries) and takes only from jobs not
            # held: when no job that may give up a GPU and is not held passes the limit, the search finds none, and
            # it passes over a held one if the lowest of those passes (passing the limit holds for every lower key)
            if slot[1] is None:
                slot[1] = self._lowest_of(node, entries)
            free, held = slot[1]
            if free is None or not (free[0] < prio or (free[0] == prio and free[1] + EPS < limit)):
                if held is not None and (held[0] < prio or (held[0] == prio and held[1] + EPS < limit)):
                    self.held_back = self._skipped_held = True
                return None
        best, best_key, me = None, None, job.id
        for e in entries:
            vid, vp, down, key, v, ok, held = e
            if vid == me:
                continue
            if finite and (vp > prio or (vp == prio and down + EPS >= limit)):
                continue
            if best_key is not None and key >= best_key:
                continue
            if not (ok if ok is not None else self._gives(e, node)):
                continue
            if held and job.g >= job.min_g:
                self.held_back = self._skipped_held = True
                continue  # changed a moment ago: only a guarantee under its minimum takes from it
            best, best_key = v, key
        return best

    def _shrunk(self, live: dict[str, list], v: _Job, node: str) -> None:
        """Keep an attempt's `live` reads as `_candidates` would make them again after `v` gave up a GPU on `node`: its
        entry on every node it holds made again (its slope down changed), and dropped where it left the node. The
        other jobs' entries do not change: the attempt changed nothing else of theirs."""
        for n in v.g_on if node in v.g_on else (node, *v.g_on):
            slot = live.get(n)
            if slot is not None:
                self._shrunk_on(slot[0], v, n)
                slot[1] = None

    @staticmethod
    def _shrunk_on(entries: list[list], v: _Job, node: str) -> None:
        """`_shrunk` on one node's entries (made again, never changed in place: a round's memo may share them)."""
        vid = v.id
        for i, e in enumerate(entries):
            if e[0] == vid:
                if node in v.g_on:
                    entries[i] = _entry(v, e[6])
                else:
                    del entries[i]
                return

    def _lowest_of(self, node: str, entries: list[list]) -> tuple[tuple | None, tuple | None]:
        """The lowest (priority, slope down) of the entries that may give up a GPU on `node`: of those not held,
        and of those held (None where there is none)."""
        free = held = None
        for e in entries:
            if not self._gives(e, node):
                continue
            rank = (e[1], e[2])
            if e[6]:
                if held is None or rank < held:
                    held = rank
            elif free is None or rank < free:
                free = rank
        return free, held

    def _gives(self, e: list, node: str) -> bool:
        """Whether the job of a `_candidates` entry may give up a GPU on `node`: over its minimum, and a guarantee
        still kept without it. Worked out when first needed, as the search did, then kept in the entry."""
        ok = e[5]
        if ok is None:
            v = e[4]
            ok = e[5] = self._over_min(v) and not (v.privileged and not self._keeps_guarantee(v, node))
        return ok

    def _candidates(self, node: str) -> list[list]:
        """What `_lowest_slope_over_min` reads of the jobs on `node` over their minimum when the attempt began
        (those in the index), in id order: [id, priority, slope down, key, job, may give up a GPU there (None:
        not worked out yet), held]. It depends only on the jobs there: an attempt changes them only by taking
        GPUs from them, or by placing the job itself on the node, and a failed attempt is undone whole."""
        dkey, jobs, held = self._dkey, self.jobs, self.held
        out = []
        for vid in sorted(self.on_node[node]):
            if vid not in dkey:  # not over its minimum when the attempt began
                continue
            out.append(_entry(jobs[vid], vid in held))
        return out

    def _none_below(self, node: str, job: _Job, victims: dict[str, _Job], limit: float | None = None) -> bool:
        """Whether no job on `node` that `_lowest_slope_over_min` would consider has a priority, or slope, below
        `job`'s own, so that it would answer None and pass over no held job. The lowest key listed under the
        node bounds those of the jobs not shrunk in this attempt (their keys are current; a job that left the
        node since only lowers the bound); the jobs shrunk in it (`victims`) are looked at with their slopes now.
        `limit`: the job's slope, where not the one it has now.

        Once the attempt has passed over a held job (`_skipped_held`, and the round's `held_back` with it), the held
        jobs are left out too: at or over its minimum (the only case asked) the search passes over them, and passing
        over another sets only what is set already."""
        if limit is None:
            limit = job.up()
        if not math.isfinite(limit):
            return False
        prio, me = job.inp.priority, job.id
        held = self.held if self._skipped_held else ()
        for key in self._node_keys[node]:  # the lowest but the job's own (and the held ones, as above)
            if key[3] != me and key[3] not in held:
                if key[0] < prio or (key[0] == prio and key[1] + EPS < limit):
                    return False
                break
        for v in victims.values():
            if node in v.g_on and v.id in self._dkey and v.id not in held:
                if v.inp.priority < prio or (v.inp.priority == prio and v.down() + EPS < limit):
                    return False
        return True

    def _keeps_guarantee(self, v: _Job, node: str) -> bool:
        """Whether a guaranteed job still meets its guarantee with one GPU less on `node`.

        Whether its plan there meets it (`_guarded`, `_meets`) depends on the job only through its kind, reference
        and request (none, or the request's placement and speed: a guarded plan that is the request meets it), and
        on the placement only through its canonical form and the CPUs per GPU as they matter (`PlanBook._cpg`): it
        is kept for the round under those (`_guarantee_memo`), shared by every job they are the same for (the jobs of
        one kind and request shrunk one GPU at a time in a cluster's first round ask the same few thousand times).
        Whether the job then ends in time is its own (`_in_time`)."""
        g_on = v.g_on
        at = (tuple(g_on.values()), g_on.get(node))
        place = _LESS_ONE.get(at)
        if place is None:
            place = canonical(tuple([g - 1 if n == node else g for n, g in g_on.items()]))
            if len(_LESS_ONE) < _LESS_ONE_KEPT:
                _LESS_ONE[at] = place
        kind, book, req = v.inp.kind, self.book, v.request
        cpg = book._cpg(kind, self._cpg_of(v)) if kind.offload else 1  # `_cpg`: 1 where nothing runs on the CPUs
        key = (book._key(kind), place, cpg, v.ref) if req is None else \
            (book._key(kind), place, cpg, v.ref, req.placement, req.throughput)
        hit = self._guarantee_memo.get(key)
        if hit is None:
            best = self._guarded(v, book.best_within(kind, place, cpg), place)
            hit = self._guarantee_memo[key] = (self._meets(v, best), best.throughput)
        return hit[0] and self._in_time(v, hit[1])

    def _room_to_give_back(self, job: _Job, want: int | None = None) -> bool:
        """Whether a guarantee may take GPUs beyond its minimum: only when the speed they give puts
        it at least one restart ahead of its deadline. GPUs it took without that slack could not be
        taken back (a shrink or a move restarts it and makes it late), so they would stay pinned
        under it until it ends, however much a later guarantee needs their nodes. `want`: the GPUs
        it would take (its `want_g` where None)."""
        terms = self._deadline_terms(job, job.want_g if want is None else want)
        if terms is None:
            return True
        due, now, work = terms
        return due - job.inp.elapsed_s - now - work >= self.restart_cost_s

    def _deadline_terms(self, job: _Job, want: int) -> tuple[float, float, float] | None:
        """What a guarantee's slack on `want` GPUs is made of, but the seconds since its submission: (the seconds its
        whole work takes at the reference, the restart it pays now if it runs, the seconds its work left takes on
        them); the slack is the first less `elapsed_s`, less the other two (`_room_to_give_back`, `_asks_window`).
        None where it always has room: fixed resources, work or target not finite, no speed on them, or no
        reference. The speed on `want` GPUs is kept on the record (`fast_memo`) while its curve and reference stay: a
        running guarantee carried over is asked it every round."""
        inp = job.inp
        remaining, target = inp.remaining_iters, inp.target_iters
        if self.fixed_resources or not (-_INF < remaining < _INF and -_INF < target < _INF):  # not finite
            return None
        curve, ref = job.curve, job.ref
        memo = job.fast_memo
        if memo is not None and memo[0] is curve and memo[1] == want and memo[2] == ref:
            fast = memo[3]
        else:
            fast = float(curve[min(want, len(curve) - 1)]) * ref
            job.fast_memo = (curve, want, ref, fast)
        if fast <= 0 or ref <= 0:
            return None
        gbs, measured = inp.kind.global_batch, inp.ref_iter_s
        per_iter = gbs / ref
        if measured < per_iter:  # noqa: PLR1730 (`min` written out: a call costs more, every round)
            per_iter = measured
        return target * per_iter, self.restart_cost_s if inp.running else 0.0, remaining * gbs / fast

    def _asks(self, job: _Job, want: int, least: int) -> int:
        """The GPUs a guarantee asks for now, wanting `want` with a minimum of `least`: its want, or its minimum where
        the clock leaves it no slack to take more (`_room_to_give_back`)."""
        floor = least if least > 1 else 1
        return want if want <= floor or self._room_to_give_back(job, want) else floor

    def _asks_window(self, job: _Job, held: tuple, want: int, least: int) -> int:
        """`_asks(job, want, least)`, for a record whose `_prepare` answer is `held`, kept in `asks_memo` with the
        seconds since submission it holds for. Only `inp.elapsed_s` of what it reads moves while the input, its
        progress, measured speed and running flag stay, and the slack `_room_to_give_back` finds only shrinks as it
        grows: the answer holds up to the edge where the slack reaches the restart cost, or from it on. Within 2e-12 of
        the sum of the sizes the edge is made of (thousands of times what rounding can move it), the answer is worked
        out each time."""
        inp = job.inp
        asks = self._asks(job, want, least)
        lo, hi = -math.inf, math.inf
        terms = self._deadline_terms(job, want) if want > max(1, least) else None
        if terms is not None:
            due, now, work = terms
            edge = due - now - work - self.restart_cost_s  # room while `elapsed_s` is at most this, rounding aside
            band = 2e-12 * (abs(due) + abs(now) + abs(work) + abs(self.restart_cost_s) + 1.0)
            lo, hi = (-math.inf, edge - band) if asks == want else (edge + band, math.inf)
            if not lo < inp.elapsed_s < hi:  # near the edge (or not a number): not kept
                lo = hi = math.nan
        job.asks_memo = (held, inp, inp.remaining_iters, inp.ref_iter_s, inp.running, lo, hi, asks)
        return asks

    @staticmethod
    def _time_left(v: _Job) -> float:
        """Seconds from now to a guaranteed job's deadline: the time its whole work takes at the
        reference (the faster of predicted and measured as asked), counted from its submission."""
        inp = v.inp
        return inp.target_iters * min(inp.kind.global_batch / v.ref, inp.ref_iter_s) - inp.elapsed_s

    def _in_time(self, v: _Job, throughput: float) -> bool:
        """Whether a running guaranteed job restarted now, then running at `throughput`, still ends
        before its deadline: the time its whole work takes at the reference, from its submission."""
        inp = v.inp
        if not inp.running or not math.isfinite(inp.remaining_iters) or not math.isfinite(inp.target_iters):
            return True
        return self.restart_cost_s + inp.remaining_iters * inp.kind.global_batch / throughput <= self._time_left(v)
