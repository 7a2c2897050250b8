"""The start of the Rubick engine's round: every job placed on what it holds as the round begins (`_place_current`),
and that placement kept for the next round to patch (`_PlaceBase`)."""

from __future__ import annotations

from .engine_index import _free_keys_of, _put_free
from .records import _NOBODY, _Job

PATCH_SHARE = 4
"""A round patches the kept placement where at most one job in this many it lists went or came (and a few more):
else it places every job again, as cheap then."""


class _PlaceBase:
    """The free GPUs, CPUs and memory of each node, the jobs holding GPUs there and the jobs placed, as a round's
    `_place_current` left them with every job placed whole (nothing cut): kept for the next round to patch. Only that
    patch writes it, before the round copies it; the round works on its copies (a node's set of jobs is replaced,
    never changed). `rows` is job id -> the rows (`_Job.current_rows`' list) it was placed by; `layout` the `_layout`
    they were placed on. `free_keys` and `free_key_of` are the nodes with free GPUs in the order of
    `RubickEngine._free_keys` (made with the placement, kept in order by the patch): a round starts from copies of
    them, where it made them again from every node's free GPUs."""

    __slots__ = ("free_c", "free_g", "free_key_of", "free_keys", "free_m", "layout", "on_node", "placed", "rows")

    def __init__(self, layout: tuple, free_g: dict, free_c: dict, free_m: dict, on_node: dict, placed: dict,
                 rows: dict) -> None:
        self.layout, self.free_g, self.free_c, self.free_m = layout, free_g, free_c, free_m
        self.on_node, self.placed, self.rows = on_node, placed, rows
        self.free_keys, self.free_key_of = _free_keys_of(free_g, layout[10])


def _rows(job: _Job) -> list:
    """The job's rows (node, GPUs, CPUs, memory) of its current allocation, by node, made again when its current
    allocation or memory is another object."""
    current, current_mem, rows = job.inp.current, job.inp.current_mem, job.current_rows
    if rows is None or rows[0] is not current or rows[1] is not current_mem:
        rows = job.current_rows = (current, current_mem, [(node, g, c, current_mem.get(node))
                                                          for node, (g, c) in sorted(current.items())])
    return rows[2]


class _Placing:
    """Part of `RubickEngine`: the jobs placed on what they hold as a round begins."""

    def _place_current(self) -> None:
        """Every job awake that holds an allocation placed on it: the free GPUs, CPUs and memory of each node less
        what the jobs hold there (`free_g`, `free_c`, `free_m`), the jobs on each node (`on_node`) and the records'
        allocations. A carried record (`_prepare`) keeps its own; a job whose allocation no longer fits (a node lost,
        another job there first) is cut (`whole` false, `forced`). The placement as it then stands is kept
        (`_PlaceBase`) where every job was placed whole; the next round on the same nodes patches it
        (`_patch_placement`) and places only the jobs that came, went or changed."""
        layout = self._layout_held
        base = getattr(self, "_place_base", None)
        if base is None or base.layout is not layout or not self._patch_placement(base):
            self._wake_dormant()  # every job placed in turn: the dormant ones too
            base = self._place_base = self._place_all(layout)
            if base is None:  # a job cut: nothing kept, the free nodes' keys made at the round's first need of them
                return
        else:
            self.free_g, self.free_c, self.free_m = dict(base.free_g), dict(base.free_c), dict(base.free_m)
            self.on_node, self.placed = dict(base.on_node), dict(base.placed)
        self._free_keys, self._free_key_of = base.free_keys.copy(), dict(base.free_key_of)  # the round's free GPUs

    def _place_all(self, layout: tuple) -> _PlaceBase | None:
        """`_place_current` from the nodes' capacities, every job awake placed in turn; the placement to keep, or None
        where a job was cut."""
        nodes = self.nodes
        free_g, free_c, free_m = self.free_g, self.free_c, self.free_m = dict(layout[7]), dict(layout[8]), dict(layout[9])
        on_node = self.on_node = dict.fromkeys(self.order, _NOBODY)
        """node -> the ids of the jobs holding GPUs there (one shared empty set where none does: a round makes a node's
        set as it places a job there, and an attempt writes a new one)"""
        placed: dict[str, _Job] = {}
        self.placed = placed
        """jobs holding GPUs (a superset: entries may have dropped to zero)."""
        listed: dict[str, list] | None = {}
        for job in self._awake:  # every running job: written for speed (`_cpg_of` worked out inline)
            current = job.inp.current
            if not current:
                continue
            if job.carried:  # placed as it was, if every part of it still fits (nothing is cut): else made again
                rows = job.current_rows[2]
                for node, g, c, m in rows:
                    if g > 0 and (node not in nodes or free_g[node] < g or free_c[node] < c or (m and m > free_m[node])):
                        self._clear(job)
                        break
                else:
                    for node, g, c, m in rows:
                        if g > 0:
                            free_g[node] -= g
                            free_c[node] -= c
                            if m and m > 0:
                                free_m[node] -= m
                            held_by = on_node[node]
                            if held_by is _NOBODY:
                                on_node[node] = {job.id}
                            else:
                                held_by.add(job.id)
                    placed[job.id] = job
                    if listed is not None:
                        listed[job.id] = rows
                    continue
            g_on, c_on, job_id = job.g_on, job.c_on, job.id
            total, low, whole = 0, None, True
            rows = _rows(job)
            for node, g, c, m in rows:
                if node not in nodes or g <= 0:
                    if g > 0:
                        job.forced, whole = True, False
                        job.reason, job.detail = "node-lost", {"node": node}
                    continue
                fg, fc = free_g[node], free_c[node]
                if fg < g:
                    g, whole = fg, False
                if fc < c:
                    c, whole = fc, False
                if g <= 0:
                    job.forced = True
                    continue
                g_on[node] = g
                c_on[node] = c
                total += g
                free_g[node] = fg - g
                free_c[node] = fc - c
                r = c // g
                if low is None or r < low:
                    low = r
                if m:
                    if m > free_m[node]:
                        m, whole = max(0.0, free_m[node]), False
                    if m > 0:
                        job.mem_on[node] = m
                        free_m[node] -= m
                held_by = on_node[node]
                if held_by is _NOBODY:
                    on_node[node] = {job_id}
                else:
                    held_by.add(job_id)
                placed[job_id] = job
            self._placed_on(job, whole, total, low)
            if listed is not None:
                if whole:
                    listed[job_id] = rows
                else:
                    listed = None
        if listed is None:
            return None
        return _PlaceBase(layout, dict(free_g), dict(free_c), dict(free_m), dict(on_node), dict(placed), listed)

    def _placed_on(self, job: _Job, whole: bool, total: int, low: int | None) -> None:
        """A job not carried, once placed on `total` GPUs of its allocation (`low`: the fewest CPUs per GPU of its
        nodes): its GPUs and best plan there."""
        job.whole = whole
        if total:
            job.g += total
            gpus, cpg = tuple(job.g_on.values()), (low if low > 1 else 1)
            memo = job.placed_memo
            if memo is not None and memo[0] == gpus and memo[1] == cpg and memo[2] is job.version:
                best = memo[3]  # what it held last round, at the same model version: the same best plan
            else:
                best = self._best_on(job, gpus, cpg)
                job.placed_memo = (gpus, cpg, job.version, best)
            job.best = best
            job.placed = (gpus, cpg, best)

    def _patch_placement(self, base: _PlaceBase) -> bool:
        """The kept placement made this round's: the jobs in it that went (or are no longer placed by the same rows)
        taken out, the jobs that came (or changed) put in, in place; False, with nothing of the placement written (a
        job's rows may have been made again, as placing it makes them), where that is not what placing every job in
        turn would make. A job carried with the rows it was kept by stays as it is.

        Every job was placed whole in the kept placement, on the same nodes; where every job that came still fits
        whole, each node's free GPUs and CPUs less all its jobs' are at least zero, and then placing the jobs in any
        order cuts none: the counts are sums, the same in any order. A node's free memory is not (floating point): on
        every node where a job that went or came holds memory, it is worked out again over the node's jobs in the
        round's order (priority, then submission), as `_place_all` would. On the others the jobs that take memory are
        the same, in the same order, as when their memory was worked out."""
        rows_of, nodes, jobs = base.rows, self.nodes, self.jobs
        came: list[_Job] = []
        kept: list[str] = []
        for job in self._awake:
            if not job.inp.current:
                continue
            if job.carried and rows_of.get(job.id) is job.current_rows[2]:
                kept.append(job.id)
            else:
                came.append(job)
        kept.extend(self._dormant)  # listed by the rows they are kept by (`_keep_dormant`)
        went = rows_of.keys() - set(kept) if len(kept) < len(rows_of) else ()
        """the jobs listed that are not kept: gone, or placed again (`came`); sums and a set are made of them, so
        their order does not matter"""
        if len(came) + len(went) > 8 + len(rows_of) // PATCH_SHARE:
            return False
        dg: dict[str, int] = {}
        dc: dict[str, int] = {}
        weighed: set[str] = set()
        """the nodes where a job that went or came holds memory: only there may the free memory differ"""
        for job_id in went:
            for node, g, c, m in rows_of[job_id]:
                if g > 0:
                    dg[node] = dg.get(node, 0) + g
                    dc[node] = dc.get(node, 0) + c
                    if m and m > 0:
                        weighed.add(node)
        rows_now: dict[str, list] = {}
        for job in came:
            rows = job.current_rows[2] if job.carried else _rows(job)
            for node, g, c, m in rows:
                if g > 0:
                    if node not in nodes:
                        return False  # a node lost under it: cut, as placing every job finds
                    dg[node] = dg.get(node, 0) - g
                    dc[node] = dc.get(node, 0) - c
                    if m and m > 0:
                        weighed.add(node)
            rows_now[job.id] = rows
        free_g, free_c = base.free_g, base.free_c
        for node, d in dg.items():
            if free_g[node] + d < 0 or free_c[node] + dc[node] < 0:
                return False
        # the jobs on each node changed, and its free memory over them in the round's order
        on: dict[str, set[str]] = {}
        for node in dg:
            on[node] = {v for v in base.on_node[node] if v not in went}
        for job_id, rows in rows_now.items():
            for node, g, _, _ in rows:
                if g > 0:
                    on[node].add(job_id)
        mem: dict[str, float] = {}
        cap_m = base.layout[9]
        for node in weighed:  # elsewhere the same jobs take memory, in the same order: the same free memory
            free = cap_m[node]
            ids = on[node]
            for job in sorted((jobs[v] for v in ids), key=_placing_order):
                rows = rows_now.get(job.id)
                m = _mem_on(rows_of[job.id] if rows is None else rows, node)
                if m:
                    if m > free:
                        return False  # cut: memory is short
                    if m > 0:
                        free -= m
            mem[node] = free
        # nothing is cut: written
        keys, key_of, pos = base.free_keys, base.free_key_of, base.layout[10]
        for node, d in dg.items():
            free_g[node] += d
            free_c[node] += dc[node]
            base.on_node[node] = on[node] or _NOBODY
            if d:
                _put_free(keys, key_of, node, free_g[node], pos)
        base.free_m.update(mem)
        for job_id in went:
            del rows_of[job_id]
            base.placed.pop(job_id, None)
        placed = base.placed
        for job in came:
            rows = rows_of[job.id] = rows_now[job.id]
            if job.carried:
                placed[job.id] = job
                continue
            g_on, c_on, mem_on = job.g_on, job.c_on, job.mem_on
            total, low = 0, None
            for node, g, c, m in rows:
                if g <= 0:
                    continue
                g_on[node] = g
                c_on[node] = c
                total += g
                r = c // g
                if low is None or r < low:
                    low = r
                if m and m > 0:
                    mem_on[node] = m
                placed[job.id] = job
            self._placed_on(job, True, total, low)
        return True


def _placing_order(job: _Job) -> tuple:
    """The order the round places the jobs awake in (`_round`: priority, then submission)."""
    inp = job.inp
    return -inp.priority, inp.order, job.id


def _mem_on(rows: list, node: str) -> float | None:
    for n, g, _, m in rows:
        if n == node and g > 0:
            return m
    return None
