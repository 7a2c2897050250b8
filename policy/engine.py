"""Algorithm 1 of the paper: one scheduling round of the Rubick policy, as pure code.

    Schedule(jobs, cluster):
      for j in jobs.privileged:                         # guaranteed, within the tenant's quota
          ScheduleJob(j)
      for j in SortBySlope(jobs.bestEffort + jobs.running):
          ScheduleJob(j)

    ScheduleJob(j): for each node, take its free GPUs and CPUs, then shrink the lowest-slope job
    over its minimum by one unit at a time while that job's slope is below j's, or while j is
    under its own minimum; shrinking to zero preempts. If j reaches its minimum, take the best
    plan for the placement found and allocate memory last (AllocMem); otherwise undo everything.

Throughputs are normalised by each job's *reference*: the predicted throughput of its owner's plan
on the requested resources, so slopes of different models compare (1.0 = as fast as requested).
Guaranteed jobs within their tenant's quota keep at least their reference throughput; their
minimum demand `min_res` is the fewest GPUs (then CPUs), under any allowed plan, that reach it,
never more than requested in any dimension (the request itself when nothing smaller reaches it).
A tenant's quota is charged with `min_res`.

Reconfiguration is not free: a running job's own growth or plan change is kept only when the time
it saves over its remaining iterations exceeds the restart cost, counted once for the job and once
for every running job it shrinks (`restart_cost_s`, default 78 s, the paper's average). Changes
forced on a job (shrunk for another, node lost, guarantee) need no such gain.

The same engine runs the ablations: with `fixed_resources` every job gets exactly its request or
waits (`rubick-e`, `rubick-n`); the plan space comes from each job's `JobKind`.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import ClassVar, Collection, Iterable, Iterator, Mapping

import numpy as np

from controlplane.events import Plan
from modeler.configs import ConfigError
from modeler.uncertainty import bound_for

from .curves import Best, JobKind, PlanBook, down_table, knee, packed, slope_down, slope_up, up_table
from .plans import canonical

EPS = 1e-9
_SKIP_FROM = 96
"""a walk over a tail of more nodes than this passes those where the search would do nothing (`_visits`); on a
shorter one, working out which to pass costs more than reading each (rounds on 80 nodes ran faster walking them)"""
MAX_HOLD_FACTOR = 16
"""The longest hold is this many times `RubickEngine.hold_s` (about 40 minutes at the default 156 s)."""


@dataclass(frozen=True)
class NodeCap:
    name: str
    gpus: int
    cpus: int
    mem_gb: float


@dataclass(slots=True)
class JobIn:
    """A job as one round sees it."""

    job_id: str
    tenant: str
    guaranteed: bool
    kind: JobKind
    order: int
    requested_gpus: int
    requested_cpus: int
    requested_plan: Plan
    requested_mem_gb: float = 0.0
    """host memory the owner asked for (0: the policy decides); the job gets at least its share of it per
    GPU it holds, on every node."""
    current: dict[str, tuple[int, int]] = field(default_factory=dict)
    """node -> (GPUs, CPUs) decided in an earlier round."""
    current_mem: dict[str, float] = field(default_factory=dict)
    """node -> host memory (GB) decided in an earlier round: the job keeps it with its GPUs until a round
    settles it again."""
    current_plan: Plan | None = None
    running: bool = False
    """The job has processes, or a launch under way, that a change would restart."""
    priority: int = 0
    """higher is scheduled first and may shrink lower-priority jobs whatever their slopes (a guarantee
    still comes first); among equal priorities the slopes decide, as in Algorithm 1."""
    remaining_iters: float = math.inf
    target_iters: float = math.inf
    elapsed_s: float = 0.0
    """seconds since submission (a guaranteed job's deadline is its reference time from then)."""
    changed_s: float = math.inf
    """seconds since a decision last changed its allocation or plan (inf: never)."""
    recent_changes: int = 0
    """decisions that changed its allocation or plan within the engine's `hold_backoff_s` (the last one
    included)."""
    ref_iter_s: float = math.inf
    """the measured seconds per iteration of its requested plan on its requested GPUs (inf: not
    measured); a guaranteed job's deadline is counted from the faster of it and the prediction."""


@dataclass(slots=True)
class Outcome:
    """A job's allocation and plan after the round."""

    job_id: str
    shares: dict[str, tuple[int, int, float]]
    """node -> (GPUs, CPUs, memory GB); empty = queued or preempted."""
    plan: Plan | None
    throughput: float
    reason: str
    _detail: dict[str, str] | tuple = field(repr=False)
    """the detail, or the arguments of `_running_detail` that make it: most outcomes repeat
    the last round's and are never published, so their detail is worked out only when read."""
    pending: tuple[str, int, dict[str, str]] | None = None
    """(reason, fewest GPUs it can start on, detail) when the job holds no GPUs or fewer than it asked for
    and could use (`controlplane.events.payloads.PENDING_REASONS`); None when it runs as it wants."""

    @property
    def detail(self) -> dict[str, str]:
        if type(self._detail) is tuple:  # (what it was given, curve, GPUs, reference, throughput, quota): made now
            self._detail = _running_detail(*self._detail)
        return self._detail


def _running_detail(given: dict[str, str], curve: np.ndarray, g: int, ref: float, tput: float,
                    quota: str | None) -> dict[str, str]:
    """The detail of a job that holds GPUs: what the round gave it, its slope down, its quota state when it runs
    as best-effort, its normalised throughput."""
    out = dict(given)
    out.setdefault("slope", f"{slope_down(curve, g):.4g}")
    if quota is not None:
        out["quota"] = quota
    out["normalised"] = f"{tput / ref:.4g}" if ref > 0 else "0"
    return out


@dataclass(slots=True)
class _Job:
    """A job in one round. Made once per job a round, positionally (`_prepare`): a call with keywords costs twice
    as much."""

    inp: JobIn
    id: str
    """`inp.job_id`"""
    cpg: int
    curve: np.ndarray
    """normalised GPU curve at `cpg` CPUs per GPU."""
    ref: float
    """reference throughput, samples/s."""
    request: Best | None = None
    """the owner's plan on the requested GPUs (packed), when it runs: what the guarantee promises."""
    min_g: int = 0
    min_c: int = 0
    want_g: int = 0
    up_tab: list[float] | None = None
    """`up_table` of its curve, as a list (read once per visit: a list is cheaper to index than an array)"""
    down_tab: list[float] | None = None
    privileged: bool = False
    g_on: dict[str, int] = field(default_factory=dict)
    c_on: dict[str, int] = field(default_factory=dict)
    mem_on: dict[str, float] = field(default_factory=dict)
    g: int = 0
    best: Best | None = None
    reason: str = ""
    detail: dict[str, str] = field(default_factory=dict)
    forced: bool = False
    placed: tuple | None = None
    """(GPUs per node, CPUs per GPU, best plan) of what it held as the round began (`_place_current`): read again
    at the round's end when it holds the same"""
    idle: Outcome | None = None
    """the outcome the record last gave holding nothing: given again while it says the same (most waiting jobs'
    do, round after round)"""
    idle_plain: bool = False
    """whether `idle` is what a waiting job whose attempt failed at once says: queued, no GPUs free or to take"""
    sleeping: bool = False
    """whether the record was found asleep (`RubickEngine._asleep`) as the last round began, and still is"""
    listed: bool = False
    """whether its key is in `RubickEngine._sleepers`"""
    key: tuple | None = None
    """its key in `RubickEngine._sleepers` as it last fell asleep (an older one left there is passed over)"""
    woke: int = -1
    """the round in which it was last tried while asleep (`RubickEngine._wake`)"""
    version: tuple | None = None
    """its kind's memo key this round (`PlanBook._key`): the same object until its model is refitted"""
    placed_memo: tuple | None = None
    """(GPUs per node, CPUs per GPU, `version`, best plan) of the last placement `_place_current` read: a running
    job's is most often the same round after round"""
    cpu_memo: tuple | None = None
    """(GPUs per node, CPUs per GPU, `version`, reference, slope) of the last `RubickEngine._cpu_slope_up` worked out"""
    running_memo: tuple | None = None
    """(the outcome, what it was made of) the record last gave holding GPUs: given again while it would say the
    same (a running job left as it runs, round after round), so the service sees at once that nothing changed"""
    touched: bool = False
    """whether a journal wrote one of its attributes since `_place_current` placed it (`_Journal.attr`): while not,
    it holds what it was placed on, and `placed` says what that is"""
    carried: bool = False
    """its record carried over as the last round left it (`_prepare`): `_place_current` places it without writing
    it, or makes it again where it no longer fits (and the flag goes)"""
    index_key: tuple | None = None
    """its key in the slope index as the round began (None: not listed), from `_index_all`: a record carried over
    has the key it had"""
    whole: bool = False
    """whether `_place_current` placed it on every part of its current allocation as asked, nothing cut"""
    current_rows: tuple | None = None
    """(its input's `current`, its `current_mem`, [(node, GPUs, CPUs, memory or None)] by node): what
    `_place_current` reads of them, made again when either is another object"""

    def up(self) -> float:
        g = self.g
        if g >= self.want_g or g >= len(self.up_tab):
            return 0.0
        return self.up_tab[g]

    def down(self) -> float:
        g = self.g
        if g <= self.min_g:
            return 0.0
        tab = self.down_tab
        return tab[g if g < len(tab) else len(tab) - 1]


class _Journal:
    """Undo log for one ScheduleJob attempt, or for several (a repack): `undo(mark)` takes back
    only what was done since `mark = len(jr.ops)`."""

    def __init__(self) -> None:
        self.ops: list[tuple[dict | _Job, object, object]] = []
        """(a dict, its key, the value before) or (a job, its attribute, the value before)"""

    def set(self, d: dict, key, value) -> None:
        """d[key] = value (None: the key removed)."""
        self.ops.append((d, key, d.get(key, _MISSING)))
        if value is None:
            d.pop(key, None)
        else:
            d[key] = value

    def attr(self, job: _Job, name: str, value) -> None:
        """Set one of a job's attributes, and mark the job `touched` (not undone: a mark left by an attempt undone only
        sends the job the long way). Every change to a job's GPUs, CPUs or memory comes with one: its GPUs or best
        plan for the job and those it shrank, `forced` for one it took CPUs from."""
        self.ops.append((job, name, getattr(job, name)))
        setattr(job, name, value)
        job.touched = True

    def undo(self, mark: int = 0) -> None:
        for d, key, old in reversed(self.ops[mark:]):
            if d.__class__ is not dict:
                setattr(d, key, old)
            elif old is _MISSING:
                d.pop(key, None)
            else:
                d[key] = old
        del self.ops[mark:]


_MISSING = object()
_NOBODY: frozenset[str] = frozenset()


def _entry(v: _Job, held: bool) -> list:
    """A job's entry in what a search reads of a node (`RubickEngine._candidates`)."""
    down, vp = v.down(), v.inp.priority
    return [v.id, vp, down, (vp, down, -v.inp.order, v.id), v, None, held]


class _Order:
    """A job's `_node_order` at or over its minimum, read as the search reaches it (`RubickEngine._visits`): its own
    nodes (`mine`, most GPUs first), then those with free GPUs (`free`: the list of them, most free first, as the
    attempt began), then the nodes where the first `end` jobs of the index hold GPUs (`_shrinkable`: the tail, by
    name, with the nodes' indices in `_by_name`), worked out only when the search gets there; most attempts stop
    among the free nodes."""

    __slots__ = ("mine", "free", "end", "tail", "tidx")

    def __init__(self, mine: list[str], free: list[str], end: int) -> None:
        self.mine, self.free, self.end = mine, free, end
        self.tail: list[str] | None = None
        self.tidx: np.ndarray | None = None

    def head(self) -> Iterator[str]:
        yield from self.mine
        if self.mine:
            mine = self.mine
            for n in self.free:
                if n not in mine:
                    yield n
        else:
            yield from self.free

    def seen(self) -> set[str]:
        return set(self.mine).union(self.free)


def _covers(have: tuple[int, ...], need: tuple[int, ...]) -> bool:
    """Whether placement `have` (GPUs per node, largest first) holds `need` node by node."""
    return len(need) <= len(have) and all(n <= h for n, h in zip(need, have))


@dataclass
class RubickEngine:
    book: PlanBook
    restart_cost_s: float = 78.0
    quotas: dict[str, int] | None = None
    """GPUs per tenant for guaranteed jobs; None = the whole cluster for every tenant. A tenant
    missing from the mapping has quota 0: its guaranteed jobs run as best-effort."""
    fixed_resources: bool = False
    default_cpus_per_gpu: int = 4
    min_cpus_per_gpu: int = 1
    mem_per_gpu_gb: float = 0.0
    """Host memory reserved per GPU beside the plan's own need (data loaders, pinned buffers)."""
    guarantee_margin: float = 0.1
    """A guaranteed job leaves its requested plan and resources only for a predicted throughput at
    least this much over its reference: predictions are trusted only so far. On its own request it
    runs its own plan unless another beats it by the margin. This is the margin of a type whose fit
    gave no error bound; where the oracle knows the type's bound (`ModelOracle.bounds`, from the fit's
    out-of-fold error), that bound is the margin instead."""
    reasons: bool = True
    """Work out each waiting or short job's pending reason (`Outcome.pending`); off only to measure its cost."""
    hold_s: float | None = None
    """A running job changed less than this long ago keeps its allocation against best-effort reasons
    (its own growth, a best-effort job's start or growth); only a guarantee under its minimum may
    take from it. Every change costs a restart, and without a floor a stream of short jobs restarts
    a long one faster than it can run. None = twice `restart_cost_s`: at least half the time after
    a change is spent running."""
    waiting_clock: ClassVar[bool] = False
    """Whether a round reads the fields of `JobIn` that follow the clock (`remaining_iters`, `elapsed_s`, `changed_s`,
    `recent_changes`, `ref_iter_s`) of a best-effort job that holds nothing. It does not: they serve the restart
    rule, holds and deadlines, which concern running and guaranteed jobs only (`PolicyCore._inputs`)."""
    hold_backoff_s: float = 0.0
    """A job changed n times within this many seconds (`JobIn.recent_changes`) is held 2^(n-1) times
    `hold_s` (at most `MAX_HOLD_FACTOR` times): a job that keeps being shrunk and grown back, as short
    jobs come and go beside it, is left alone longer each time, where a job changed once in a while
    keeps the short hold. 0 = the same hold for every job."""

    # ---------------------------------------------------------------------------------------
    def schedule(self, nodes: list[NodeCap], jobs: list[JobIn]) -> list[Outcome]:
        """Every job's outcome this round, in the order of the round's records (`schedule_changed`, with the
        outcome objects of the jobs it leaves out)."""
        made = {o.job_id: o for o in self._round(nodes, jobs)}
        return [j.idle if (o := made.get(j.id)) is None else o for j in self.jobs.values()]

    def schedule_changed(self, nodes: list[NodeCap], jobs: Collection[JobIn] | Mapping[str, JobIn],
                         touched: Collection[str] | None = None) -> list[Outcome]:
        """A round: the outcomes of the jobs whose outcome may differ from the one the last round gave. Left out is a
        waiting job asleep (`_asleep`) and not tried this round (`_wake`) whose last outcome said it waits for GPUs
        and nothing else (`_Job.idle_plain`): its outcome is that object again (`_Job.idle`). The policy service
        keeps it; over a long queue, most jobs are such.

        `touched` (with `jobs` a mapping, job id -> input): the ids of the jobs whose input may not be the object
        the last round was handed, and of those handed then and not now. The caller promises that every other input
        is the last round's object, its fields as they were but for those that follow the clock of a job holding
        GPUs or guaranteed. A round then looks only at those jobs, the jobs awake or tried last round, and the
        sleepers of a kind whose model was refitted: the other sleepers cost it nothing. None: every input is
        looked at."""
        return self._round(nodes, jobs, touched)

    def _round(self, nodes: list[NodeCap], jobs, touched: Collection[str] | None = None) -> list[Outcome]:
        layout = self._layout(nodes)
        self.nodes, self.order, self._by_name, self._nidx, self._names = layout[1:6]
        self._lo_p, self._lo_s = layout[6].copy(), layout[6].copy()
        """by `_by_name`: the priority and slope of the lowest key listed under each node in `_node_keys` (infinite
        where none); `_reindex` keeps them"""
        self._un_p, self._un_s = layout[6].copy(), layout[6].copy()
        """the same for the keys of the jobs not held (`_unheld_keys`)"""
        self.free_g, self.free_c, self.free_m = dict(layout[7]), dict(layout[8]), dict(layout[9])
        self.on_node: dict[str, set[str] | frozenset[str]] = dict.fromkeys(self.order, _NOBODY)
        """node -> the ids of the jobs holding GPUs there (one shared empty set where none does: a round makes a node's
        set as it places a job there, and an attempt writes a new one)"""
        last_round = getattr(self, "jobs", {})
        """the last round's records, made again for this round's jobs (`_prepare`); nothing else keeps them"""
        last_awake = getattr(self, "_awake", ())
        self.placed: dict[str, _Job] = {}
        """jobs holding GPUs (a superset: entries may have dropped to zero)."""
        self.by_down: list[tuple[int, float, int, str]] = []
        """(priority, slope, -order, id) of every job holding GPUs over its minimum, lowest priority, then
        lowest slope first."""
        self._dkey: dict[str, tuple[float, int, str]] = {}
        self._node_keys: dict[str, list[tuple[int, float, int, str]]] = defaultdict(list)
        """node -> the `by_down` keys of the jobs that held GPUs there when they were indexed, lowest first"""
        self._unheld_keys: dict[str, list[tuple[int, float, int, str]]] = {}
        """node -> those of its `_node_keys` whose jobs are not held (a node is listed once a key is)"""
        self._dnodes: dict[str, tuple[str, ...]] = {}
        """job -> the nodes its `by_down` key is listed under in `_node_keys`"""
        self._guarantee_memo: dict = {}
        self._free_list: list[str] | None = None
        self._free_keys: list[tuple[int, int, str]] | None = None
        """(-free GPUs, position in the nodes' order, node) of every node with free GPUs, lowest first: the order of
        `_free_nodes`. Made at the round's first need of it, then kept: the nodes whose free GPUs were written since
        (`_free_dirty`) are put in their place again when next needed"""
        self._free_key_of: dict[str, tuple[int, int, str]] = {}
        self._free_dirty: set[str] = set()
        self._pos = layout[10]
        self._room_of: dict[str, tuple | None] | None = None
        """node -> its room (`_room`), once the round has asked for the nodes by room (`_by_room`); with it the
        rooms in order (`_room_keys`) and the nodes marked since they were worked out (`_room_stale`)"""
        self._room_keys: list[tuple] = []
        self._room_stale: set[str] = set()
        self._free_any: bool | None = None
        """whether `_free_list` would not be empty; both are None once free GPUs change (`_free_changed`)"""
        self.held_back = False
        """whether holding a job changed this round's outcome (the round is worth running again later)"""
        self.why: dict[str, str] = {}
        """job -> why its last attempt to start or grow fell short (a pending reason)"""
        self._skipped_held = False
        self._quota_used: dict[str, int] = {}
        self._failed: dict[tuple, str] | None = None
        """in the round's queue: the key of an attempt that failed (`_repeat_key`) -> its pending reason"""
        self._kept = 0
        """attempts whose changes were kept, since the queue began"""
        self._margins_seen: dict[str, tuple] = {}
        """model type -> `_margins_key`, for this round"""
        self._cluster_gpus = layout[11]
        self._least_seen: dict[tuple[int, int], int] = {}
        """(id of a job's kind, its CPUs per GPU) -> `_least`, for this round (its jobs keep their kinds alive)"""
        self._scans: dict[str, list[list]] = {}
        """in the round's queue: node -> [`_candidates`, `_lowest_of` them]; a kept attempt drops the nodes it
        changed (`_forget`)"""
        self._orders: dict[int, list[str]] = {}
        """in the round's queue: the end of the prefix of the index a job holding nothing may shrink (-1: none) ->
        its `_node_order`, until an attempt is kept"""
        now = self._round_no = getattr(self, "_round_no", 0) + 1
        was = getattr(self, "_sleeping", {})
        """id -> the record of each job asleep as the last round began and not awake since"""
        self._woken: list[_Job] = []
        """sleepers tried this round (`_wake`)"""
        self._awake: list[_Job] = []
        """this round's jobs but the sleepers, by priority (highest first), then submission order"""
        versions: dict[int, tuple] = {}
        """id of a kind -> its memo key (`PlanBook._key`), for this round"""
        fell_asleep: list[_Job] = []
        to_make = []
        whole = touched is None or not getattr(self, "_ended", False) or type(jobs) is not dict
        self._ended = False
        """whether the last round ran to its end: one cut short (an error) leaves its sleepers half looked at, and
        the next round looks at every input"""
        if whole:
            # every input looked at: this round's records, sleepers and memos made again whole
            given = jobs.values() if type(jobs) is dict else jobs
            prepared, self._prepared = getattr(self, "_prepared", {}), {}
            self.jobs: dict[str, _Job] = {}
            for record in was.values():
                record.sleeping = False
            self._sleeping, self._unplain, self._sleep_kinds = {}, {}, {}
            prior = was
            candidates = ((inp.job_id, inp) for inp in given)
        else:
            # the others are last round's sleepers, untouched: kept asleep as they are, not looked at
            prepared = self._prepared
            ids = set(touched)
            for job in last_awake:
                ids.add(job.id)
            for job in getattr(self, "_woken_last", ()):
                ids.add(job.id)
            for kid, (kind, version, members) in list(self._sleep_kinds.items()):
                if self.book._key(kind) is not version:  # refitted: its sleepers are made again
                    ids.update(members)
                    del self._sleep_kinds[kid]
            prior = {job_id for job_id in ids if job_id in was}
            for job_id in prior:
                self._fall_awake(was[job_id])
            for job_id in ids:
                if job_id not in jobs:  # over, or no model: gone from the round
                    self.jobs.pop(job_id, None)
                    prepared.pop(job_id, None)
            candidates = ((job_id, jobs[job_id]) for job_id in sorted(ids) if job_id in jobs)
        for job_id, inp in candidates:  # the sleepers first (nothing reads their order); the rest sorted below
            record = last_round.get(job_id)
            if record is not None and record.inp is inp and (
                    (job_id in prior and record.woke != now - 1) or self._asleep(record)):
                kind = inp.kind  # asleep through the last round and not tried: nothing touched it
                version = versions.get(id(kind))
                if version is None:
                    version = versions[id(kind)] = self.book._key(kind)
                held = prepared.get(job_id)
                if held is not None and held[1] is version:  # no refit of its model since it was made
                    self.jobs[job_id] = record  # what `_prepare` would make of it again: kept as it is
                    self._prepared[job_id] = held
                    self._fall_asleep(record, kind, version)
                    if not record.listed:
                        fell_asleep.append(record)
                    continue
            to_make.append((-inp.priority, inp.order, job_id, inp, record))
        to_make.sort(key=lambda a: a[:3])
        hold = 2 * self.restart_cost_s if self.hold_s is None else self.hold_s
        self.held = {inp.job_id for *_, inp, _ in to_make  # a sleeper runs on nothing: none is held
                     if inp.running and inp.current and inp.changed_s < hold * self._backoff(inp)}
        unplain = list(self._unplain.values())
        """sleepers whose last outcome is not the plain one (`_Job.idle_plain`): their outcomes are made again"""
        for *_, inp, record in to_make:
            job = self.jobs[inp.job_id] = self._prepare(inp, prepared, record)
            self._awake.append(job)
            if inp.guaranteed and job.want_g > max(1, job.min_g) and not self._room_to_give_back(job):
                job.want_g = max(1, job.min_g)
                self._tables(job)
        self._place_current()
        self._index_all()
        self._privileged()
        queue = self._sort_by_slope()
        self._list_sleepers(fell_asleep, len(self._sleeping))
        self._kept = 0
        self._failed = {}
        self._scans, self._orders = {}, {}
        sleepers, at = self._sleepers, 0
        for key in queue:  # merged with the sleepers' keys, in the order one sort of all would give
            if at < len(sleepers) and sleepers[at] < key:
                at = self._wake(at, key)
            self._schedule_job(key[-1])
        self._wake(at, None)
        self._failed = None
        finish = self._finish
        out = ([finish(j) for j in self._awake] + [finish(j) for j in self._woken]
               + [finish(j) for j in unplain if j.woke != now])
        for job in unplain:
            if job.idle_plain:
                del self._unplain[job.id]
        self._woken_last = self._woken
        self._ended = True
        return out

    def _fall_asleep(self, job: _Job, kind: JobKind, version: tuple) -> None:
        """Keep a record asleep this round (`_sleeping`), listed under its kind at its model's version, and among
        those whose outcome is made again while its last one is not the plain one."""
        job.sleeping = True
        self._sleeping[job.id] = job
        # a kind's sleepers all sleep at its current version (a refit wakes them all); were one listed at an older
        # one, the next round would find the version changed and look at them all again
        self._sleep_kinds.setdefault(id(kind), (kind, version, set()))[2].add(job.id)
        if not job.idle_plain:
            self._unplain[job.id] = job

    def _fall_awake(self, job: _Job) -> None:
        """A sleeper of the last round looked at again: out of the sleepers until it is found asleep again. Its key
        leaves the list of sleepers' keys at once (`_wake` would pass it over, at every round until the list is made
        again); found asleep again, it is listed again with a fresh key, in the same place (`_list_sleepers`)."""
        job.sleeping = False
        del self._sleeping[job.id]
        self._unplain.pop(job.id, None)
        group = self._sleep_kinds.get(id(job.inp.kind))
        if group is not None:
            group[2].discard(job.id)
        if job.listed:
            keys, key = self._sleepers, job.key
            at = bisect.bisect_left(keys, key)
            if at < len(keys) and keys[at] is key:
                del keys[at]
            job.listed = False

    def _asleep(self, job: _Job) -> bool:
        """Whether a job's record from the last round is what `_prepare` would make of it again (while its model is not
        refitted), and its attempt reads nothing that follows the clock: a best-effort job holding nothing and asking
        for no minimum, whose input is the same object, and which the last round left as it found it. Such a job
        (most of a long queue) is not made again, not sorted again (`_sleepers`), and not tried while the search
        would fail at once (`_wake`)."""
        inp = job.inp
        if inp.guaranteed or inp.current or inp.running or job.g or job.g_on or job.c_on or job.mem_on or job.min_g:
            return False
        return not (job.best is not None or job.reason or job.detail or job.privileged or job.forced
                    or job.placed is not None)

    def _list_sleepers(self, fell_asleep: list[_Job], asleep: int) -> None:
        """`_sleepers`: the queue keys (`_sort_by_slope`) of this round's sleeping jobs, lowest first: last round's
        list, and the keys of those that fell asleep. A sleeper's key cannot change while it sleeps. The key of a job
        awake now or gone is left in the list (`_wake` passes it over: `_current`) until such keys are as many as
        this round's `asleep` sleepers; the list is then made again of the sleepers' keys alone."""
        now = self._round_no
        keys = getattr(self, "_sleepers", [])
        if len(keys) - asleep + len(fell_asleep) > asleep + 64:
            keys = [k for k in keys if self._current(k, now)]
        for job in fell_asleep:
            job.listed = True
        serial = getattr(self, "_serial", 0)  # a job's keys, and a key and the job's queue key, differ before the job
        fresh = [(-job.inp.priority, -job.up(), -0.0, job.inp.order, job.id, serial + i, job)
                 for i, job in enumerate(fell_asleep, start=1)]
        self._serial = serial + len(fresh)
        for k in fresh:
            k[-1].key = k
        if len(fresh) < 16:
            for k in fresh:
                bisect.insort(keys, k)
        else:
            keys += fresh
            keys.sort()
        self._sleepers = keys

    def _wake(self, at: int, until: tuple | None) -> int:
        """Try the sleepers from `at` whose keys sort below `until` (all: None), in order, and return where the next
        begin. A sleeper's attempt fails at once, changing nothing, where no GPU is free and it may take none
        (`_may_gather`); then so does every sleeper after it up to `until` (their priority and slope are no higher,
        the round's state is the same): they are passed over, with the reason `no-gpus` that attempt would give."""
        sleepers = self._sleepers
        end = len(sleepers) if until is None else bisect.bisect_left(sleepers, until, at)
        now = self._round_no
        while at < end:
            key = sleepers[at]
            job = key[-1]
            if not self._current(key, now):
                at += 1
                continue
            if not self._any_free() and not self._beats(job, self.lowest):
                break
            job.woke = now
            self._woken.append(job)
            self._schedule_job(job)
            at += 1
        return end

    @staticmethod
    def _current(key: tuple, now: int) -> bool:
        """Whether a key in `_sleepers` is a sleeper's of this round (not one left by a job awake now or gone)."""
        job = key[-1]
        return job.sleeping and job.key is key

    # --- set-up ------------------------------------------------------------------------------
    def _layout(self, nodes: list[NodeCap]) -> tuple:
        """What a round reads of the nodes alone, kept while they are the same: (the nodes, name -> node, their names
        in the given order, by name, name -> index by name, the names by name as an array, an array of infinities,
        each node's GPUs, CPUs and memory, name -> position in the given order, and the GPUs of all). Read only: a
        round copies what it changes."""
        key = tuple(nodes)
        held = getattr(self, "_layout_held", None)
        if held is None or held[0] != key:  # the same node objects compare at once (a service keeps them)
            order = [n.name for n in nodes]
            by_name = sorted(order)
            held = self._layout_held = (
                key, {n.name: n for n in nodes}, order, by_name, {n: i for i, n in enumerate(by_name)},
                np.array(by_name, dtype=object), np.full(len(nodes), math.inf),
                {n.name: n.gpus for n in nodes}, {n.name: n.cpus for n in nodes},
                {n.name: float(n.mem_gb) for n in nodes}, {name: i for i, name in enumerate(order)},
                sum(n.gpus for n in nodes))
        return held

    def _backoff(self, inp: JobIn) -> float:
        """How many times the hold a job is held: 2^(n-1) for n changes within `hold_backoff_s`."""
        if self.hold_backoff_s <= 0 or inp.recent_changes <= 1:
            return 1.0
        return float(min(MAX_HOLD_FACTOR, 2 ** (inp.recent_changes - 1)))

    def _ratio(self, inp: JobIn) -> int:
        if inp.requested_cpus > 0:
            return max(self.min_cpus_per_gpu, inp.requested_cpus // max(1, inp.requested_gpus))
        return self.default_cpus_per_gpu

    def reference(self, inp: JobIn) -> tuple[float, int]:
        """(reference throughput, CPUs per GPU) of the owner's plan on the requested resources."""
        cpg = min(self._ratio(inp), self.book.max_cpus_per_gpu)
        place = packed(inp.requested_gpus, self.book.node_gpus)
        kind = inp.kind
        times, request = self._request(inp, cpg)
        if request is not None:
            return kind.global_batch / float(times[0]), cpg
        best = self.book.best(kind, place, cpg).throughput
        if best > 0:
            return best, cpg
        return float(self.book.gpu_curve(kind, cpg).max()), cpg

    def _request(self, inp: JobIn, cpg: int) -> tuple[np.ndarray, Best | None]:
        """(seconds per iteration, the owner's plan on its packed request) or None if it cannot run."""
        place = packed(inp.requested_gpus, self.book.node_gpus)
        kind = inp.kind
        try:
            times, plans = self.book.oracle.evaluate(kind.model, kind.global_batch, place, cpg, [inp.requested_plan])
        except ConfigError:  # the requested plan cannot run on its own request (e.g. TP across nodes)
            return np.array([np.inf]), None
        if np.isfinite(times[0]) and times[0] > 0:
            return times, Best(kind.global_batch / float(times[0]), plans[0], canonical(place))
        return times, None

    def min_res(self, inp: JobIn, ref: float, cpg: int) -> tuple[int, int]:
        """Fewest GPUs, then CPUs, reaching `ref` (by the guarantee margin) under any allowed plan,
        within the request; the request itself when nothing smaller does."""
        for g in range(1, inp.requested_gpus):
            place = packed(g, self.book.node_gpus)
            for c in range(1, cpg + 1):
                best = self.book.best(inp.kind, place, c)
                if best.throughput >= ref * (1 + self._margin(inp.kind, best.plan)):
                    return g, g * c
        return inp.requested_gpus, inp.requested_gpus * cpg

    def _guarded(self, job: _Job, best: Best, held: tuple[int, ...] | None = None) -> Best:
        """The plan a guaranteed job runs: the predicted best (`best`, on `best.placement`, which may
        give back some of the GPUs `held`) when it beats the reference by the margin, else its own
        plan where what it holds covers its request's placement."""
        if best.plan is None or best.throughput >= job.ref * (1 + self._margin(job.inp.kind, best.plan)):
            return best
        if job.request is None:
            return best
        if (best.placement == job.request.placement if held is None
                else _covers(canonical(held), job.request.placement)):
            return job.request
        return best

    def _meets(self, job: _Job, best: Best | None) -> bool:
        """Whether `best` (already guarded) keeps the guarantee."""
        if best is None or best.plan is None:
            return False
        return best is job.request or best.throughput >= job.ref * (1 + self._margin(job.inp.kind, best.plan))

    def _margin(self, kind: JobKind, plan: Plan | None = None) -> float:
        """The predicted gain a guaranteed job needs to leave its request for `plan`: the error bound of
        the plan's family from the type's fit (the type's overall bound for a family it has none of,
        `guarantee_margin` where the fit gave none), or the most the oracle has seen this type's
        predictions overshoot the measured speed, if more."""
        oracle = self.book.oracle
        bound = bound_for(getattr(oracle, "bounds", {}).get(kind.model.name), plan)
        base = self.guarantee_margin if bound is None else bound
        seen = getattr(oracle, "overshoot", None)
        return max(base, seen.get(kind.model.name, 0.0)) if seen else base

    def _margins_key(self, kind: JobKind) -> tuple:
        """What the type's margins depend on (a memo key); worked out once per type a round (the oracle's bounds
        and what it has seen change between rounds only)."""
        name = kind.model.name
        key = self._margins_seen.get(name)
        if key is None:
            key = self._margins_seen[name] = self._margins_now(kind)
        return key

    def _margins_now(self, kind: JobKind) -> tuple:
        oracle = self.book.oracle
        bounds = getattr(oracle, "bounds", {}).get(kind.model.name)
        seen = getattr(oracle, "overshoot", None)
        return (tuple(sorted(bounds.items())) if bounds else None,
                seen.get(kind.model.name, 0.0) if seen else 0.0, self.guarantee_margin)

    def _prepare(self, inp: JobIn, prepared: dict | None = None, record: _Job | None = None) -> _Job:
        """The job for this round, from what its request means (`_demand`, memoised per kind). `prepared`: the
        last round's job id -> (what the memo's key was made of, its answer); a job asking the same of the same
        kind, at the same model version, takes its answer from there without hashing the key again. `record`: the
        job's record of the last round, made again in place (a round makes thousands: fewer objects for the
        garbage collector to walk)."""
        guaranteed = inp.guaranteed and not self.fixed_resources
        kind = inp.kind
        version = self.book._key(kind)  # the kind's memo key at its model's version: the same object until a refit
        margins = self._margins_key(kind) if guaranteed else None
        held = prepared.get(inp.job_id) if prepared is not None else None
        if (held is not None and held[1] is version and record is not None and record.inp is inp and not inp.guaranteed
                and record.placed is not None and record.version is version and record.current_rows is not None
                and record.current_rows[0] is inp.current and record.current_rows[1] is inp.current_mem
                and record.whole
                and not (record.touched or record.forced or record.reason or record.detail or record.privileged)):
            # a best-effort job the last round placed on its current allocation and did not touch since, asking the
            # same at the same model version: its record is what this round makes of it, once placed the same way
            self._prepared[inp.job_id] = held
            record.carried = True
            return record
        if held is None or held[1] is not version or held[6] != margins or (
                (record is None or record.inp is not inp)  # the same input object asks the same (a waiting job's)
                and (held[0] is not kind or held[2] is not inp.requested_plan or held[3] != inp.requested_gpus
                     or held[4] != self._ratio(inp) or held[5] != guaranteed)):
            plan, gpus, ratio = inp.requested_plan, inp.requested_gpus, self._ratio(inp)
            key = ("job", plan, gpus, ratio, guaranteed, margins)
            held = (kind, version, plan, gpus, ratio, guaranteed, margins,
                    self.book.memo(kind, key, lambda: self._demand(inp, guaranteed)))
        if prepared is not None:
            self._prepared[inp.job_id] = held
        cpg, ref, curve, want_g, min_g, min_c, up_tab, down_tab, request = held[7]
        if record is None:
            job = _Job(inp, inp.job_id, cpg, curve, ref, request, min_g, min_c, want_g, up_tab, down_tab)
            job.version = version
            return job
        record.version = version
        record.inp, record.cpg, record.curve, record.ref, record.request = inp, cpg, curve, ref, request
        record.min_g, record.min_c, record.want_g, record.up_tab, record.down_tab = min_g, min_c, want_g, up_tab, down_tab
        self._clear(record)
        return record

    @staticmethod
    def _clear(record: _Job) -> None:
        """A record as `_prepare` makes it again: holding nothing, no flag, reason or detail."""
        record.privileged = record.forced = record.listed = record.touched = record.carried = record.whole = False
        record.g, record.best, record.reason, record.placed = 0, None, "", None
        for held_on in (record.g_on, record.c_on, record.mem_on):
            if held_on:
                held_on.clear()
        if record.detail:  # a detail is replaced, never changed (an outcome may still hold it): an empty one stays
            record.detail = {}

    def _demand(self, inp: JobIn, guaranteed: bool) -> tuple:
        """(CPUs per GPU, reference, normalised curve, wanted GPUs, minimum GPUs, minimum CPUs,
        slope tables up and down, the request as a plan): what a job's request means, the same for every job of its kind
        with the same request."""
        book, kind = self.book, inp.kind
        ref, cpg = self.reference(inp)
        curve = book.memo(kind, ("norm", cpg, ref), lambda: self._normalised(kind, cpg, ref))
        if self.fixed_resources:
            want_g = min_g = inp.requested_gpus
            min_c = inp.requested_gpus * cpg
        else:
            want_g, min_g, min_c = max(1, knee(curve)), 0, 0
        if guaranteed:
            min_g, min_c = self.min_res(inp, ref, cpg)
        probe = _Job(inp=inp, id=inp.job_id, cpg=cpg, curve=curve, ref=ref, want_g=want_g, min_g=min_g)
        self._tables(probe)
        request = self._request(inp, cpg)[1] if guaranteed else None
        return cpg, ref, curve, want_g, min_g, min_c, probe.up_tab, probe.down_tab, request

    def _normalised(self, kind: JobKind, cpg: int, ref: float) -> np.ndarray:
        raw = self.book.gpu_curve(kind, cpg)
        curve = raw / ref if ref > 0 else raw * 0
        curve.setflags(write=False)
        return curve

    def _tables(self, job: _Job) -> None:
        kind = job.inp.kind
        job.up_tab = self.book.memo(kind, ("up", job.cpg, job.ref, job.want_g),
                                    lambda: up_table(job.curve, job.want_g).tolist())
        job.down_tab = self.book.memo(kind, ("down", job.cpg, job.ref, job.min_g),
                                      lambda: down_table(job.curve, job.min_g).tolist())

    def _place_current(self) -> None:
        nodes, free_g, free_c, free_m, on_node = self.nodes, self.free_g, self.free_c, self.free_m, self.on_node
        placed = self.placed
        for job in self._awake:  # every running job, every round: written for speed (`_cpg_of` worked out inline)
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
                    continue
            g_on, c_on, job_id = job.g_on, job.c_on, job.id
            total, low, whole = 0, None, True
            rows, current_mem = job.current_rows, job.inp.current_mem
            if rows is None or rows[0] is not current or rows[1] is not current_mem:
                rows = job.current_rows = (current, current_mem, [(node, g, c, current_mem.get(node))
                                                                  for node, (g, c) in sorted(current.items())])
            for node, g, c, m in rows[2]:
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
            job.whole = whole
            if total:
                job.g += total
                gpus, cpg = tuple(g_on.values()), (low if low > 1 else 1)
                memo = job.placed_memo
                if memo is not None and memo[0] == gpus and memo[1] == cpg and memo[2] is job.version:
                    best = memo[3]  # what it held last round, at the same model version: the same best plan
                else:
                    best = self._best_on(job, gpus, cpg)
                    job.placed_memo = (gpus, cpg, job.version, best)
                job.best = best
                job.placed = (gpus, cpg, best)

    def _privileged(self) -> None:
        """Lines 2-3: guaranteed jobs within their tenant's quota, charged at `min_res`. A running
        guaranteed job that meets its guarantee keeps it; one that does not (it ran over quota
        before, or its placement is too fragmented) is placed again as a privileged job."""
        used: dict[str, int] = {}
        retry: set[str] = set()  # ids: a job is no other's equal, and comparing dataclasses field by field is slow
        for job in self._awake:
            if not (job.inp.guaranteed and job.g and self._quota_left(job, used) >= job.min_g):
                continue
            place = canonical(tuple(job.g_on.values()))
            as_asked = job.request is not None and place == job.request.placement  # its own request's GPUs
            if self._meets(job, self._guarded(job, job.best, place if as_asked else None)
                           if job.best is not None else None):
                job.privileged = True
                used[job.inp.tenant] = used.get(job.inp.tenant, 0) + job.min_g
                self._reindex(job)
            else:
                retry.add(job.id)
        for job in self._awake:
            if not job.inp.guaranteed or (job.g and job.id not in retry):
                continue
            if self._quota_left(job, used) < job.min_g:
                job.detail = {"quota": "exceeded" if self._quota(job) else "none"}
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

    def _repack(self, job: _Job) -> bool:
        """A guarantee that no placement meets because other guarantees hold a few GPUs on each of
        the nodes it needs: move guaranteed jobs that run on one node onto a node with room, to
        clear those nodes. A moved job gets the fewest GPUs (at least its minimum) with which it
        still ends before its deadline after the restart; one that cannot stays. The nodes to
        clear are those with the fewest such GPUs to move; the jobs are placed biggest first on the
        node with the least room that holds them (best fit). Undone whole when any step fails."""
        need = packed(max(1, job.min_g), self.book.node_gpus)
        if len(need) > len(self.order):
            return False
        pinned = {n: 0 for n in self.order}
        movable: dict[str, list[_Job]] = {n: [] for n in self.order}
        size: dict[str, int] = {}
        for v in self.jobs.values():
            if v is job or not v.privileged or v.g <= 0:
                continue
            g = self._size_in_time(v) if len(v.g_on) == 1 else None
            if g is not None:
                movable[next(iter(v.g_on))].append(v)
                size[v.id] = g
            else:
                for n, g in v.g_on.items():
                    pinned[n] += g
        load = {n: sum(size[v.id] for v in movable[n]) for n in self.order}
        cap = {n: self.nodes[n].gpus - pinned[n] for n in self.order}
        chosen: list[str] = []
        for want in need:
            fits = [n for n in self.order if n not in chosen and cap[n] >= want]
            if not fits:
                return False
            chosen.append(min(fits, key=lambda n: (load[n], pinned[n], n)))
        room = {n: cap[n] - load[n] for n in self.order}
        for n, want in zip(chosen, need):
            room[n] = cap[n] - want
        moves: list[tuple[_Job, str]] = []
        for v in sorted((v for n in chosen for v in movable[n]), key=lambda v: (-size[v.id], v.id)):
            g, home = size[v.id], next(iter(v.g_on))
            if room[home] >= g:
                room[home] -= g  # stays where it is
                continue
            fits = [n for n in self.order if room[n] >= g]
            if not fits:
                return False
            to = min(fits, key=lambda n: (room[n], n))
            room[to] -= g
            moves.append((v, to))
        if not moves:
            return False  # nothing to move: the plain attempt already failed on these nodes
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

    def _size_in_time(self, v: _Job) -> int | None:
        """The fewest GPUs on one node, at least its minimum, with which a running guaranteed job
        restarted now still ends before its deadline (its speed: the reference, or the predicted best
        less the type's margin where that is more); None when no node size does."""
        for g in range(max(1, v.min_g), self.book.node_gpus + 1):
            best = self.book.best(v.inp.kind, (g,), self._cpg_of(v))
            margin = 1 + self._margin(v.inp.kind, best.plan)
            if self._in_time(v, max(v.ref, best.throughput / margin if best.plan is not None else 0.0)):
                return g
        return None

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

    def _sort_by_slope(self) -> list[tuple]:
        """The queue's keys, lowest first, each ending in its job: the jobs awake this round (`_asleep`), but those a
        guarantee placed."""
        keyed = []
        for j in self._awake:
            if j.privileged and j.g and j.reason == "guarantee":
                continue
            cpu = self._cpu_slope_up(j) if j.g else 0.0
            keyed.append((-j.inp.priority, -j.up(), -cpu, j.inp.order, j.id, 0, j))
        keyed.sort()  # ids are unique: no comparison reaches the job itself
        return keyed

    # --- CPUs ---------------------------------------------------------------------------------
    def _cpg_of(self, job: _Job) -> int:
        c_on, low = job.c_on, None
        for n, g in job.g_on.items():
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
        """`_free_keys`, up to date: made whole once a round, then only the nodes written since put in place again."""
        keys = self._free_keys
        if keys is None:
            pos = self._pos
            keys = self._free_keys = sorted([(-g, pos[n], n) for n, g in self.free_g.items() if g > 0])
            self._free_key_of = {k[2]: k for k in keys}
            self._free_dirty.clear()
        elif self._free_dirty:
            of, free_g, pos = self._free_key_of, self.free_g, self._pos
            for n in self._free_dirty:
                old, g = of.get(n), free_g[n]
                if old is not None:
                    if old[0] == -g:
                        continue
                    del keys[bisect.bisect_left(keys, old)]
                    del of[n]
                if g > 0:
                    key = of[n] = (-g, pos[n], n)
                    bisect.insort(keys, key)
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
        """`_shrinkable` for a long prefix, from the lowest keys listed under the nodes."""
        nidx = self._nidx
        bound, node_keys, p, s = self.by_down[end - 1], self._node_keys, self._lo_p, self._lo_s
        bp, bs = bound[0], bound[1]
        within = (p < bp) | ((p == bp) & (s < bs))
        for i in np.flatnonzero((p == bp) & ~(s < bs) & ~(s > bs)).tolist():  # a tie, or a slope not a number
            within[i] = node_keys[self._by_name[i]][0] <= bound
        if seen:
            within[np.fromiter(map(nidx.__getitem__, seen), np.intp, len(seen))] = False
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
        n, j, k = len(tidx), 0, 0
        cand = seen_at = None
        lows: dict[bool, tuple[np.ndarray, np.ndarray]] = {}
        while j < n:
            unheld = self._skipped_held
            if job.g < job.min_g or not math.isfinite(limit := job.up()) or (short and not unheld):
                yield tail[j]
                j, seen_at = j + 1, None
                continue
            state = (limit, len(victims), unheld)
            if state == seen_at:  # the positions to visit are as they were: the next one is the next listed
                k += 1
            else:
                low = lows.get(unheld)
                if low is None:
                    low = lows[unheld] = ((self._un_p[tidx], self._un_s[tidx]) if unheld
                                          else (self._lo_p[tidx], self._lo_s[tidx]))
                low_p, low_s = low
                prio = job.inp.priority
                mask = (low_p < prio) | ((low_p == prio) & (low_s + EPS < limit))
                extra = [*self._dnodes.get(job.id, ())]
                for v in victims.values():
                    extra.extend(v.g_on)
                if extra:
                    at = np.fromiter(map(self._nidx.__getitem__, extra), np.intp, len(extra))
                    pos = np.searchsorted(tidx, at)
                    inside = pos < n
                    pos, at = pos[inside], at[inside]
                    mask[pos[tidx[pos] == at]] = True
                cand, seen_at = np.flatnonzero(mask).tolist(), state
                k = bisect.bisect_left(cand, j)
            if k >= len(cand):
                return
            j = cand[k]
            yield tail[j]
            j += 1

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
        """`_reindex` of every job holding GPUs as the round begins, into the round's new, empty index, in one go: the
        keys gathered, then each list sorted once. The lists are sorted and the keys unique, so the order they were
        made in makes no difference, but for a slope that is not a number: it compares neither below nor above any
        other, and where one is, the jobs are indexed one by one, as `_reindex` would."""
        gathered, unordered = [], False
        for job in self._awake:
            if job.carried:  # as the last round began: the same key
                key = job.index_key
            elif job.g > 0 and self._over_min(job) and (not job.privileged or self._keeps_guarantee(
                    job, min(job.g_on, key=lambda n: (job.g_on[n], n)))):
                key = job.index_key = (job.inp.priority, job.down(), -job.inp.order, job.id)
            else:
                job.index_key = None
                continue
            if key is not None:
                unordered = unordered or key[1] != key[1]
                gathered.append((job, key))
        if unordered:
            for job in self._awake:
                if job.g:
                    self._reindex(job)
            return
        held, node_keys, unheld_keys, dkey, dnodes = self.held, self._node_keys, self._unheld_keys, self._dkey, self._dnodes
        keys, listed = [], set()
        for job, key in gathered:
            keys.append(key)
            dkey[job.id] = key
            nodes = dnodes[job.id] = tuple(job.g_on)
            listed.update(nodes)
            if job.id in held:
                for n in nodes:
                    node_keys[n].append(key)
            else:
                for n in nodes:
                    node_keys[n].append(key)
                    unheld_keys.setdefault(n, []).append(key)
        keys.sort()
        self.by_down = keys
        nidx, lo_p, lo_s, un_p, un_s = self._nidx, self._lo_p, self._lo_s, self._un_p, self._un_s
        for n in listed:
            i, ks = nidx[n], node_keys[n]
            ks.sort()
            lo_p[i], lo_s[i] = ks[0][0], ks[0][1]
            ks = unheld_keys.get(n)
            if ks:
                ks.sort()
                un_p[i], un_s[i] = ks[0][0], ks[0][1]

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
        if old is not None:
            del self._dkey[job.id]
            del self.by_down[bisect.bisect_left(self.by_down, old)]
            for node in self._dnodes.pop(job.id):
                self._unlist(self._node_keys[node], old, node, self._lo_p, self._lo_s)
                if unheld is not None:
                    self._unlist(unheld[node], old, node, self._un_p, self._un_s)
        if key is not None:
            bisect.insort(self.by_down, key)
            self._dkey[job.id] = key
            nodes = self._dnodes[job.id] = tuple(job.g_on)
            for node in nodes:
                self._enlist(self._node_keys[node], key, node, self._lo_p, self._lo_s)
                if unheld is not None:
                    self._enlist(unheld.setdefault(node, []), key, node, self._un_p, self._un_s)

    def _enlist(self, keys: list[tuple], key: tuple, node: str, p: np.ndarray, s: np.ndarray) -> None:
        """Put `key` in a node's sorted `keys`, and the node's lowest in `p` and `s` where it becomes the lowest."""
        at = bisect.bisect_left(keys, key)
        keys.insert(at, key)
        if not at:
            self._low_changed(node, keys, p, s)

    def _unlist(self, keys: list[tuple], key: tuple, node: str, p: np.ndarray, s: np.ndarray) -> None:
        """Take `key` out of a node's sorted `keys`, and the node's lowest in `p` and `s` where it was the lowest."""
        at = bisect.bisect_left(keys, key)
        del keys[at]
        if not at:
            self._low_changed(node, keys, p, s)

    def _low_changed(self, node: str, keys: list[tuple[int, float, int, str]], p: np.ndarray, s: np.ndarray) -> None:
        i = self._nidx[node]
        p[i], s[i] = (keys[0][0], keys[0][1]) if keys else (math.inf, math.inf)

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
        best, best_key = None, None
        for e in entries:
            vid, vp, down, key = e[0], e[1], e[2], e[3]
            if vid == job.id:
                continue
            if finite and (vp > prio or (vp == prio and down + EPS >= limit)):
                continue
            if best_key is not None and key >= best_key:
                continue
            if not self._gives(e, node):
                continue
            if e[6] and job.g >= job.min_g:
                self.held_back = self._skipped_held = True
                continue  # changed a moment ago: only a guarantee under its minimum takes from it
            best, best_key = e[4], key
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
        """Whether a guaranteed job still meets its guarantee with one GPU less on `node`."""
        place = tuple(g - (1 if n == node else 0) for n, g in v.g_on.items())
        key = (v.id, place, self._cpg_of(v))
        hit = self._guarantee_memo.get(key)
        if hit is None:
            best = self._guarded(v, self.book.best_within(v.inp.kind, place, key[2]), place)
            hit = self._guarantee_memo[key] = self._meets(v, best) and self._in_time(v, best.throughput)
        return hit

    def _room_to_give_back(self, job: _Job) -> bool:
        """Whether a guarantee may take GPUs beyond its minimum: only when the speed they give puts
        it at least one restart ahead of its deadline. GPUs it took without that slack could not be
        taken back (a shrink or a move restarts it and makes it late), so they would stay pinned
        under it until it ends, however much a later guarantee needs their nodes."""
        inp = job.inp
        if self.fixed_resources or not (math.isfinite(inp.remaining_iters) and math.isfinite(inp.target_iters)):
            return True
        fast = float(job.curve[min(job.want_g, len(job.curve) - 1)]) * job.ref
        if fast <= 0 or job.ref <= 0:
            return True
        now = self.restart_cost_s if inp.running else 0.0
        return self._time_left(job) - now - inp.remaining_iters * inp.kind.global_batch / fast >= self.restart_cost_s

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

    def _move(self, jr: _Journal, node: str, src: _Job | None, dst: _Job, gpus: int) -> None:
        if self._room_of is not None:
            self._room_stale.add(node)
        if src is None:
            jr.set(self.free_g, node, self.free_g[node] - gpus)
            self._free_changed((node,))
        else:
            left = src.g_on[node] - gpus
            jr.set(src.g_on, node, left if left > 0 else None)
            jr.attr(src, "g", src.g - gpus)
            keep_c = min(src.c_on.get(node, 0), left * max(1, src.c_on.get(node, 0) // max(1, src.g_on.get(node, 1) + gpus)))
            if left <= 0:
                keep_c = 0
            freed = src.c_on.get(node, 0) - keep_c
            jr.set(src.c_on, node, keep_c if left > 0 else None)
            jr.set(self.free_c, node, self.free_c[node] + freed)
            if left <= 0:
                jr.set(self.on_node, node, self.on_node[node] - {src.id})
                if node in src.mem_on:  # off the node: its memory there is free again
                    jr.set(self.free_m, node, self.free_m[node] + src.mem_on[node])
                    jr.set(src.mem_on, node, None)
        jr.set(dst.g_on, node, dst.g_on.get(node, 0) + gpus)
        jr.attr(dst, "g", dst.g + gpus)
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
        repeat = self._repeat_key(job) if queued else None
        if repeat is not None and repeat in self._failed:
            self.why[job.id] = self._failed[repeat]
            return False
        jr = jr if jr is not None else _Journal()
        mark = len(jr.ops)
        before = (dict(job.g_on), dict(job.c_on), job.best)
        free_before = (self._free_list, self._free_any)  # what the cache of free nodes is again once undone
        if job.g < job.min_g:  # under its minimum: fail fast when free and shrinkable GPUs cannot cover it
            spare = sum(self.free_g.values()) + sum(self.jobs[vid].g - self.jobs[vid].min_g
                                                   for *_, vid in self.by_down if vid != job.id)
            if job.g + spare < job.min_g:
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
        nodes = (self._node_order(job, orders) if only is None else only) if self._may_gather(job, floor) else ()
        if type(nodes) is _Order:
            if g0 >= max(1, job.min_g) and job.inp.running:  # a running job's growth the restart rule refuses
                taken = self._takes_free_only(job, nodes, floor, target)
                if taken and self._settles_back(job, taken, before[2]):
                    self._reindex(job)  # as the undo would (nothing was written)
                    self.why[job.id] = "held"  # the restart rule: what it would take it gives back, nothing faster
                    return True
            nodes = self._visits(job, nodes, victims)
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
                victims[victim.id] = victim
                if self._over_min(victim):
                    floor = min(floor, (victim.inp.priority, victim.down()))
        if (not victims and job.g == g0 and g0 >= max(1, job.min_g) and job.inp.running
                and self._settled(job, before[2])):
            self._reindex(job)  # as the undo below would (nothing was written)
            self.why[job.id] = "held"  # the restart rule, as below: nothing gathered, nothing faster
            return True
        touched = [job, *victims.values()]
        gathered = job.g
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
        best = self.book.best(job.inp.kind, best.placement, self._cpg_of(job))
        if job.privileged:
            best = self._guarded(job, best)
            if not self._meets(job, best):
                return False
        if best.plan is None:
            return False
        if not self._alloc_mem(jr, job, best):
            return False
        jr.attr(job, "best", best)
        return True

    def _may_gather(self, job: _Job, floor: tuple[float, float]) -> bool:
        """Whether an attempt's search may find a GPU for the job: one free, or one it may take from a job below
        `floor` (any, under its minimum). When it may not, every node would be passed over."""
        return job.g < job.min_g or self._any_free() or self._beats(job, floor)

    def _settled(self, job: _Job, old: Best | None, chosen: Best | None = None) -> bool:
        """Whether `_settle` on the job's allocation as it is (an attempt that gathered nothing) would give back
        nothing, find its CPUs as they are and the memory its plan needs, and end on a plan no faster than `old`
        (its best as the attempt began): the restart rule (`_worth_it`) would then refuse the change, and the
        attempt be undone whole. Read without writing anything; each check is `_settle`'s own, in its order, and a
        case it does not answer for sure (a trim, CPUs to take, reclaim or give back) is left to `_settle` itself.
        `chosen`: the best plan `_settle` found first, already guarded, where it looked at a larger allocation and
        gives back all the GPUs it took (`_settles_back`)."""
        if old is None or old.throughput <= 0 or not job.c_on:
            return False
        g_on, c_on = job.g_on, job.c_on
        cpg = self._cpg_of(job)
        place = tuple(g_on.values())
        best = chosen if chosen is not None else self._first_best(job, place, max(cpg, job.cpg))
        if best is None:
            return False
        if best.placement != canonical(place):
            return False  # a plan on fewer GPUs: `_trim` would give some back
        want, floor = self._cpu_want(job)
        if want < floor:
            return False
        for node, g in g_on.items():
            if c_on.get(node, 0) != g * want:
                return False
        best = self.book.best(job.inp.kind, best.placement, cpg)
        if job.privileged:
            best = self._guarded(job, best)
            if not self._meets(job, best):
                return False
        if best.plan is None or best.throughput > old.throughput * (1 + 1e-9):
            return False
        per_node, asked = self._mem_want(job, best)
        free_m, mem_on, per_gpu = self.free_m, job.mem_on, self.mem_per_gpu_gb
        for node, g in g_on.items():
            if free_m[node] + mem_on.get(node, 0.0) < max(per_node + per_gpu * g, asked * g) - 1e-9:
                return False
        return True

    def _takes_free_only(self, job: _Job, order: _Order, floor: tuple[float, float], target: int) -> dict[str, int] | None:
        """The free GPUs an attempt's search over `order` would take (node -> GPUs), read without writing anything,
        where it takes only free GPUs and looks at no job to shrink on the way: at each node it reaches, nobody else
        is there, no job anywhere is below the job (`floor`), or none there is (`_none_below`), with the job's slope
        at the GPUs it would hold by then. None where the search would look for a job to shrink, or go on past the
        free nodes to the nodes of jobs it may shrink."""
        free_g, on_node, me = self.free_g, self.on_node, job.id
        up_tab, want, g = job.up_tab, job.want_g, job.g
        taken: dict[str, int] = {}
        for node in order.head():
            if target - g <= 0:
                return taken
            take = min(free_g[node], target - g)
            if take > 0:
                taken[node] = take
                g += take
            others = on_node[node]
            if not others or (len(others) == 1 and me in others):
                continue
            limit = 0.0 if g >= want or g >= len(up_tab) else up_tab[g]  # `_Job.up` at the GPUs it would hold
            if self._beats(job, floor, limit) and not self._none_below(node, job, {}, limit):
                return None
        return None if order.end and target - g > 0 else taken

    def _settles_back(self, job: _Job, taken: dict[str, int], old: Best | None) -> bool:
        """Whether `_settle`, after the search took the free GPUs `taken`, would give them all back (the best plan
        within the larger allocation is on what the job holds, and `_trim` keeps exactly that), then find the job's
        CPUs and memory as they are and a plan no faster than `old`: the restart rule refuses the change and the
        attempt is undone whole (`_settled` answers the rest, read the same way)."""
        g_on = dict(job.g_on)
        for node, take in taken.items():
            g_on[node] = g_on.get(node, 0) + take
        c_on, low = job.c_on, None  # `_cpg_of` over the larger allocation (no CPUs yet on the nodes taken)
        for node, g in g_on.items():
            r = c_on.get(node, 0) // g
            if low is None or r < low:
                low = r
        cpg = (job.cpg if low is None else (low if low > 1 else 1)) if c_on else job.cpg
        best = self._first_best(job, tuple(g_on.values()), max(cpg, job.cpg))
        if best is None:
            return False
        kept: dict[str, int] = {}  # `_trim`: the i-th node by GPUs keeps the i-th of the plan's placement
        for i, node in enumerate(sorted(g_on, key=lambda n: (-g_on[n], n))):
            keep = best.placement[i] if i < len(best.placement) else 0
            g = g_on[node] if g_on[node] <= keep else keep
            if g > 0:
                kept[node] = g
        return kept == job.g_on and self._settled(job, old, best)

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

    def _cpu_want(self, job: _Job) -> tuple[int, int]:
        """(CPUs per GPU `_alloc_cpus` gives the job on its GPUs now, the fewest it may run on)."""
        kind, place = job.inp.kind, canonical(tuple(job.g_on.values()))
        top = self.book.memo(kind, ("cpu-knee", place), lambda: knee(self.book.cpu_curve(kind, place)))
        want = max(top, self.min_cpus_per_gpu, job.min_c // max(1, job.g) if job.min_c else 0)
        if self.fixed_resources:
            want = max(want, job.cpg)
        floor = max(self.min_cpus_per_gpu, -(-job.min_c // max(1, job.g)) if job.min_c else 0)
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

    def _mem_want(self, job: _Job, best: Best) -> tuple[float, float]:
        """(The plan's host memory per node, the owner's requested memory per GPU) that `_alloc_mem` gives."""
        kind = job.inp.kind
        need = self.book.oracle.host_mem_gb(kind.model, kind.global_batch, best.placement,
                                            best.plan) if best.plan.offload else 0.0
        return need / max(1, len(job.g_on)), job.inp.requested_mem_gb / max(1, job.inp.requested_gpus)

    def _too_short(self, job: _Job) -> bool:
        """Whether a running job at its minimum or over has less work left at its current speed than one restart:
        whatever its attempt gathered, the time saved (`_worth_it`) would be less than that, so the restart rule would
        refuse the change and the attempt be undone whole. Its search is not run once the round is already to be run
        again (`held_back`): a search that passes over a held job sets that, and the rest of what it does is undone.
        The job is answered `held`, the restart rule; a search that gathered GPUs on which no plan settles answered
        `no-fit` (or `no-gpus`) instead, a case no trace here showed."""
        old, inp = job.best, job.inp
        if not inp.running or job.g < max(1, job.min_g) or old is None or not old.throughput > 0:
            return False
        return inp.remaining_iters * (inp.kind.global_batch / old.throughput) <= self.restart_cost_s

    def _worth_it(self, job: _Job, old: Best | None, victims: dict[str, _Job]) -> bool:
        """The restart rule for a running job's own change."""
        if old is None or old.throughput <= 0 or job.best is None:
            return True
        if job.best.throughput <= old.throughput * (1 + 1e-9):
            return False
        gbs = job.inp.kind.global_batch
        saved = job.inp.remaining_iters * (gbs / old.throughput - gbs / job.best.throughput)
        restarts = 1 + sum(1 for v in victims.values() if v.inp.running)
        return saved > self.restart_cost_s * restarts

    # --- the end of the round -----------------------------------------------------------------
    def _least(self, job: _Job) -> int:
        """The fewest GPUs on which some plan of the job fits in memory (0: none on this cluster)."""
        kind = job.inp.kind
        key = (id(kind), job.cpg)  # the book's memo, read once per kind object and CPUs per GPU in a round
        least = self._least_seen.get(key)
        if least is None:
            def first() -> int:
                hit = np.flatnonzero(job.curve > 0)
                return int(hit[0]) if len(hit) else 0
            least = self._least_seen[key] = self.book.memo(kind, ("least", job.cpg), first)
        return least

    def _pending(self, job: _Job, gpus: int, why: str | None = None) -> tuple[str, int, dict[str, str]] | None:
        """Why the job holds no GPUs, or fewer than it asked for and could use; None when it does not."""
        if not self.reasons or gpus > 0 and gpus >= min(job.inp.requested_gpus, job.want_g):
            return None
        needs = max(1, job.min_g) if job.privileged else max(1, self._least(job))
        quota = job.detail.get("quota")
        if job.inp.guaranteed and quota is not None and not job.privileged:
            return "quota", needs, {"quota": str(self._quota(job)),
                                    "quota_used": str(self._quota_used.get(job.inp.tenant, 0))}
        return why or self.why.get(job.id, "no-gpus"), needs, {}

    def _finish(self, job: _Job) -> Outcome:
        if job.g <= 0:
            reason = job.reason if job.reason in ("preempted", "node-lost") else (job.reason or "queued")
            if job.inp.current and reason == "queued":
                reason = "preempted"
            pending, last = self._pending(job, 0), job.idle
            if last is not None and last.reason == reason and last._detail is job.detail and last.pending == pending:
                return last
            job.idle = Outcome(job.id, {}, None, 0.0, reason, job.detail, pending)
            job.idle_plain = (reason == "queued" and not job.detail and pending is not None and pending[0] == "no-gpus"
                              and not pending[2])
            return job.idle
        placed = job.placed
        if not job.touched:  # it holds what it was placed on as the round began: the same best plan
            gpus, cpg, best = placed
        else:
            cpg, gpus = self._cpg_of(job), tuple(job.g_on.values())
            if placed is not None and placed[0] == gpus and placed[1] == cpg:
                best = placed[2]  # it holds what it held as the round began: the same best plan
            else:
                best = self._best_on(job, gpus, cpg)
        if job.privileged:
            best = self._guarded(job, best, gpus)
        if best.plan is None:
            return Outcome(job.id, {}, None, 0.0, "preempted", {"why": "no plan fits the placement left"},
                           self._pending(job, 0, "no-fit"))
        plan = best.plan
        cur = job.inp.current_plan
        if cur is not None and not job.forced and job.inp.running and plan != cur and self._same_alloc(job):
            # the current plan on the whole allocation (the best plan may leave GPUs unused): asked of the oracle once
            # per model version, placement and CPUs (a job kept on its plan asks the same every round)
            place = canonical(gpus)
            t_old = self.book.memo(job.inp.kind, ("current", place, cpg, cur),
                                   lambda: self._iter_time(job.inp.kind, place, cpg, cur))
            gbs = job.inp.kind.global_batch
            held = job.id in self.held  # changed a moment ago: keeps its plan whatever it would gain
            if math.isfinite(t_old) and (held or
                                         job.inp.remaining_iters * (t_old - gbs / best.throughput) <= self.restart_cost_s):
                self.held_back = self.held_back or held
                kept = Best(gbs / t_old, cur, place)
                return self._outcome(job, cur, kept.throughput, kept)
        return self._outcome(job, plan, best.throughput, best)

    def _iter_time(self, kind: JobKind, placement: tuple[int, ...], cpg: int, plan: Plan) -> float:
        """The oracle's seconds per iteration of `plan` on `placement` (inf: it cannot tell, or the plan does not run
        there)."""
        try:
            times = self.book.oracle.evaluate(kind.model, kind.global_batch, placement, cpg, [plan])[0]
        except ConfigError:
            return math.inf
        return float(times[0]) if len(times) else math.inf

    @staticmethod
    def _same_alloc(job: _Job) -> bool:
        """Whether the job holds exactly the GPUs and CPUs it held before the round."""
        current = job.inp.current
        c_on = job.c_on
        if len(job.g_on) != sum(1 for gc in current.values() if gc[0] > 0):
            return False
        for n, g in job.g_on.items():
            if current.get(n) != (g, c_on.get(n, 0)):
                return False
        return True

    def _outcome(self, job: _Job, plan: Plan, tput: float, best: Best) -> Outcome:
        g_on, c_on, mem_on = job.g_on, job.c_on, job.mem_on
        reason = job.reason or ("start" if not job.inp.current else "keep")
        quota = None
        if job.inp.guaranteed and not job.privileged and "guarantee" not in job.detail:
            quota = "exceeded" if self._quota(job) else "none"  # runs as best-effort
        pending = self._pending(job, sum(best.placement))
        memo = job.running_memo
        if memo is not None and memo[6] == best.placement and memo[7] == g_on and memo[8] == c_on and memo[9] == mem_on:
            # the last outcome it gave holding GPUs, on the same GPUs, CPUs and memory: given again if every other
            # part of this one is the same; else the new one takes its shares (and plan, where equal) as they are,
            # objects the service finds equal at once (a held job's pending reason comes and goes as GPUs are freed
            # and taken)
            _, m_plan, m_tput, m_reason, m_quota, m_pending, _, m_g, m_c, m_mem, m_detail, m_curve, m_ref = memo
            if m_plan is plan or m_plan == plan:
                if (m_tput == tput and m_reason == reason and m_quota == quota and m_pending == pending
                        and m_detail is job.detail and m_curve is job.curve and m_ref == job.ref):
                    return memo[0]
                plan = m_plan
            shares = memo[0].shares
        else:
            m_g, m_c, m_mem = dict(g_on), dict(c_on), dict(mem_on)
            if len(g_on) == 1:  # one node: the placement's one entry is its share there
                [n] = g_on
                g = best.placement[0]
                shares = {n: (g, c_on.get(n, 0), round(mem_on.get(n, 0.0), 3))} if g > 0 else {}
            else:
                used = zip(sorted(g_on, key=lambda n: (-g_on[n], n)), best.placement)
                shares = {n: (g, c_on.get(n, 0), round(mem_on.get(n, 0.0), 3)) for n, g in used if g > 0}
        # made only when read (`Outcome.detail`); a job's detail is replaced, never changed
        later = (job.detail, job.curve, job.g, job.ref, tput, quota)
        out = Outcome(job.id, shares, plan, tput, reason, later, pending)
        job.running_memo = (out, plan, tput, reason, quota, pending, best.placement, m_g, m_c, m_mem, job.detail,
                            job.curve, job.ref)
        return out
