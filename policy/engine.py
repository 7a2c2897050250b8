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
from dataclasses import dataclass
from typing import ClassVar, Collection, Mapping

import numpy as np

from controlplane.events import Plan
from modeler.configs import ConfigError
from modeler.uncertainty import bound_for

from .curves import Best, JobKind, PlanBook, down_table, knee, packed, up_table
from .engine_dormant import _Dormant
from .engine_guarantees import _Guarantees
from .engine_index import _NodeIndex
from .engine_outcome import _Outcomes
from .engine_place import _Placing
from .engine_search import _Search
from .plans import canonical
from .records import EPS, JobIn, NodeCap, Outcome, _covers, _Job

__all__ = ["EPS", "MAX_HOLD_FACTOR", "JobIn", "NodeCap", "Outcome", "RubickEngine"]

MAX_HOLD_FACTOR = 16
"""The longest hold is this many times `RubickEngine.hold_s` (about 40 minutes at the default 156 s)."""

_INSORT_SHARE = 16
"""`RubickEngine._sort_by_slope` puts the keys made again into last round's queue one at a time (a bisection, about
log2(n) comparisons, and a move of the keys after it) while there is at most one for every this many kept: else it
sorts them with the kept ones (a sort compares every key of a run in order at least once)."""



@dataclass
class RubickEngine(_Guarantees, _NodeIndex, _Search, _Outcomes, _Placing, _Dormant):
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
        self._round(nodes, jobs)
        return [self.outcome_of(job_id) for job_id in self.jobs]

    def outcome_of(self, job_id: str) -> Outcome:
        """The job's outcome as the last round had it: the one it gave, or the one it left out as the same (a sleeper
        not looked at since a round was cut short says what it said when it fell asleep)."""
        job = self.jobs[job_id]
        return job.idle if job.given is None else job.given

    def schedule_changed(self, nodes: list[NodeCap], jobs: Collection[JobIn] | Mapping[str, JobIn],
                         touched: Collection[str] | None = None) -> list[Outcome]:
        """A round: the outcomes of the jobs whose outcome may differ from the one the last round gave. Left out is a
        waiting job asleep (`_asleep`) and not tried this round (`_wake`) whose last outcome said it waits for GPUs
        and nothing else (`_Job.idle_plain`): its outcome is that object again (`_Job.idle`). The policy service
        keeps it; over a long queue, most jobs are such. So is any job whose outcome is the very object a round gave
        last (`_Job.given`): a running job left as it runs, most often.

        `touched` (with `jobs` a mapping, job id -> input): the ids of the jobs whose input may not be the object
        the last round was handed, and of those handed then and not now. The caller promises that every other input
        is the last round's object, its fields as they were but for those that follow the clock of a job holding
        GPUs or guaranteed. A round then looks only at those jobs, the jobs awake last round, the sleepers it tried and
        placed (one whose attempt failed is left as it was found, and sleeps on), and the sleepers of a kind whose
        model was refitted: the other sleepers cost it nothing. None: every input is
        looked at."""
        return self._round(nodes, jobs, touched)

    def _round(self, nodes: list[NodeCap], jobs, touched: Collection[str] | None = None) -> list[Outcome]:
        layout = self._layout(nodes)
        self.nodes, self.order, self._by_name, self._nidx, self._names = layout[1:6]
        self._lo_p, self._lo_s, self._lo_o = layout[6].copy(), layout[6].copy(), layout[6].copy()
        """by `_by_name`: the priority, slope and submission order (negated, as keys hold it; exact as a float while
        under 2**53) of the lowest key listed under each node in `_node_keys` (infinite where none); `_reindex` keeps
        them"""
        self._un_p, self._un_s = layout[6].copy(), layout[6].copy()
        """the same for the keys of the jobs not held (`_unheld_keys`)"""
        self._within: dict[tuple, np.ndarray] = {}
        """the last key of a prefix of `by_down` -> which nodes, by name, have their lowest key in `_node_keys` within
        it (`_shrinkable_listed`), for the round: a node's lowest key changed, its entries are written again
        (`_low_changed`)"""
        last_round = getattr(self, "jobs", {})
        """the last round's records, made again for this round's jobs (`_prepare`); nothing else keeps them"""
        last_awake = getattr(self, "_awake", ())
        self.by_down: list[tuple[int, float, int, str]] = []
        """(priority, slope, -order, id) of every job holding GPUs over its minimum, lowest priority, then
        lowest slope first."""
        self._dkey: dict[str, tuple[float, int, str]] = {}
        self._node_keys: dict[str, list[tuple[int, float, int, str]]] = defaultdict(list)
        """node -> the `by_down` keys of the jobs that held GPUs there when they were indexed, lowest first"""
        self._unheld_keys: dict[str, list[tuple[int, float, int, str]]] = {}
        """node -> those of its `_node_keys` whose jobs are not held (a node is listed once a key is)"""
        self._listed_held: set[str] = set()
        """the jobs whose keys are listed as held (in `_node_keys`, not in `_unheld_keys`): the kept index's `held` once
        the round works on it (`_index_all`), which `_reindex` keeps"""
        self._dnodes: dict[str, tuple[str, ...]] = {}
        """job -> the nodes its `by_down` key is listed under in `_node_keys`"""
        self._guarantee_memo: dict = {}
        self._sizes: dict[str, tuple] = {}
        """job id -> ((minimum, CPUs per GPU, reference), `_size_in_time`), for this round"""
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
        if not hasattr(self, "_margins_last"):
            self._margins_last: dict[str, tuple] = {}
            """model type -> the last `_margins_key` worked out for it, kept across rounds"""
        self._cluster_gpus = layout[11]
        self._node_most = layout[12]
        """the most GPUs a node has"""
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
        self._versions: dict[int, int] = {}
        """id of a kind -> its memo key (`PlanBook._key`), for this round (`_version`)"""
        fell_asleep: list[_Job] = []
        to_make = []
        ended = getattr(self, "_ended", False)
        whole = touched is None or not ended or type(jobs) is not dict
        if not ended:  # a round cut short (an error) gave none of the outcomes it made: every record's is given again
            for record in last_round.values():
                record.given = None
            self._place_base = None  # its records may be half written: every job is placed again
            self._index_base = None  # the index it wrote may be half written too: made whole again
        self._ended = False
        """whether the last round ran to its end: one cut short (an error) leaves its sleepers half looked at, and
        the next round looks at every input"""
        hold = self.rest_hold()
        refits = getattr(self.book.oracle, "refits", None)
        refits = refits() if refits is not None else None
        """what the oracle says of its models' versions (None: it does not say): while it is the same as at the last
        round, no kind's memo key (`_version`) changed, and the sleepers' kinds need no look"""
        self._forwarded: list[str] = []
        """the resting jobs whose inputs this round asked for (`_bring_forward`)"""
        if whole:
            # every input looked at: this round's records, sleepers and memos made again whole
            if self.resting:
                self._bring_forward(list(self.resting))
            self._dormant, self._roused = {}, []
            given = jobs.values() if type(jobs) is dict else jobs
            prepared, self._prepared = getattr(self, "_prepared", {}), {}
            self.jobs: dict[str, _Job] = {}
            for record in was.values():
                record.sleeping = False
            self._sleeping, self._unplain, self._sleep_kinds, self._quota_sleepers = {}, {}, {}, {}
            prior = was
            candidates = ((inp.job_id, inp) for inp in given)
        else:
            # the others are last round's sleepers, untouched: kept asleep as they are, not looked at
            prepared = self._prepared
            ids = set(touched)
            dormant = getattr(self, "_dormant", {})
            for job in last_awake:
                if job.id not in dormant:  # `_fall_dormant` made it dormant at the last round's end
                    ids.add(job.id)
            for job in getattr(self, "_woken_last", ()):
                ids.add(job.id)
            refitted = refits is None or refits != getattr(self, "_refits", None)
            if refitted:  # a model refitted since the last round
                for kid, (kind, version, members) in list(self._sleep_kinds.items()):
                    if self._version(kind) is not version:  # refitted: its sleepers are made again
                        ids.update(members)
                        del self._sleep_kinds[kid]
            self._keep_dormant(ids, jobs, hold, refitted)  # the others are made again
            prior = {job_id for job_id in ids if job_id in was}
            for job_id in prior:
                self._fall_awake(was[job_id])
            for job_id in ids:
                if job_id not in jobs:  # over, or no model: gone from the round
                    _let_go(self.jobs.pop(job_id, None))
                    prepared.pop(job_id, None)
            candidates = ((job_id, jobs[job_id]) for job_id in sorted(ids) if job_id in jobs)
        for job_id, inp in candidates:  # the sleepers first (nothing reads their order); the rest sorted below
            record = last_round.get(job_id)
            if record is not None and record.inp is inp and (  # a job on an allocation is never asleep
                    (job_id in prior and record.woke != now - 1) or (not inp.current and self._asleep(record))):
                kind = inp.kind  # asleep through the last round and not tried: nothing touched it
                version = self._version(kind)
                held = prepared.get(job_id)
                if held is not None and held[1] is version:  # no refit of its model since it was made
                    self.jobs[job_id] = record  # what `_prepare` would make of it again: kept as it is
                    self._prepared[job_id] = held
                    self._fall_asleep(record, kind, version)
                    if not record.listed:
                        fell_asleep.append(record)
                    continue
            to_make.append((-inp.priority, inp.order, job_id, inp, record))
        self._refits = refits
        to_make.sort()  # ids are unique: no comparison reaches the input
        # a sleeper runs on nothing: none is held. `_backoff` is asked only where it may be more than 1 (a window, and
        # two changes or more in it), as `_keep_dormant` asks it
        backoff, backoff_of = self.hold_backoff_s > 0, self._backoff
        self.held = {inp.job_id for _, _, _, inp, _ in to_make if inp.running and inp.current
                     and inp.changed_s < (hold * backoff_of(inp) if backoff and inp.recent_changes > 1 else hold)}
        self.held.update(self._dormant)  # held, as `_keep_dormant` found
        unplain = list(self._unplain.values())
        """sleepers whose last outcome is not the plain one (`_Job.idle_plain`): their outcomes are made again"""
        for _, _, _, inp, record in to_make:  # `_make_awake`, written out: every job awake, every round
            job = self.jobs[inp.job_id] = self._prepare(inp, prepared, record)
            self._awake.append(job)
            if (inp.guaranteed and not job.carried and job.want_g > max(1, job.min_g)
                    and not self._room_to_give_back(job)):
                job.want_g = max(1, job.min_g)
                self._tables(job)
        if whole:
            for job_id, record in last_round.items():
                if job_id not in self.jobs:  # a job gone: its record is read no more
                    _let_go(record)
        self._place_current()
        kept = self._keep_guarantees()
        self._index_all()
        if self._privileged(*kept):  # sleepers outside their quota woken: out of the sleepers' lists
            unplain = [j for j in unplain if j.sleeping]
            fell_asleep = [j for j in fell_asleep if j.sleeping]
        queue = self._sort_by_slope()
        self._list_sleepers(fell_asleep, len(self._sleeping))
        self._kept = 0
        self._failed = {}
        self._scans, self._orders = {}, {}
        sleepers, at, held, why, resting = self._sleepers, 0, self.held, self.why, self.resting
        for key in queue:  # merged with the sleepers' keys, in the order one sort of all would give
            if at < len(sleepers) and sleepers[at] < key:
                at = self._wake(at, key)
            job = key[-1]
            g = job.g
            if g < job.want_g or g < job.min_g:  # else its attempt would end at once, changing nothing
                if g and g >= job.min_g and job.id in held:  # `_schedule_job`'s answer to a job held, written out
                    free = self._free_any
                    if (free if free is not None else self._any_free()) or self._beats(job, self.lowest):
                        self.held_back = True  # it could have grown
                        why[job.id] = "held"
                    continue
                if resting and job.id in resting:  # a dormant record a guarantee shrank: tried, it reads its clock
                    self._bring_forward((job.id,))
                self._schedule_job(job)
        self._wake(at, None)
        self._failed = None
        finish, quiet_of, out, why = self._finish, self._quiet, [], self.why
        self._finished_dormant: list[_Job] = []
        """the dormant records this round finished: `_fall_dormant` looks at them again"""
        for j in self._awake:  # an outcome the last round gave again is left out: the service has it
            quiet = j.quiet
            if (quiet is not None and j.carried and not j.touched and not j.reason and not j.forced
                    and j.privileged is j.quiet_priv and (quiet is True or why.get(j.id, "no-gpus") == quiet)):
                continue  # carried over as it was when its last outcome was made: `_finish` would give it again
            if (o := finish(j)) is not j.given:
                j.given = o
                out.append(o)
            j.quiet = quiet_of(j) if j.g else None
        for j in self._dormant.values():  # as `_finish` would give it, where `_quiet` says so
            quiet = j.quiet
            if j.touched or quiet is None or (quiet is not True and why.get(j.id, "no-gpus") != quiet):
                j.quiet = None  # finished: worked out again at the round's end (`_fall_dormant`)
                self._finished_dormant.append(j)
                if j.id in resting:
                    self._bring_forward((j.id,))
                if (o := finish(j)) is not j.given:
                    j.given = o
                    out.append(o)
        for j in self._woken:
            if j.answered != now and (o := finish(j)) is not j.given:
                j.given = o
                out.append(o)
        seen_of: dict[str, tuple[int, int]] = {}
        """tenant -> (its quota, what the round used of it)"""
        for j in unplain:
            if j.woke == now:
                continue
            inp = j.inp
            if not inp.guaranteed:
                if (o := finish(j)) is not j.given:
                    j.given = o
                    out.append(o)
                continue
            seen = seen_of.get(inp.tenant)  # a guarantee asleep outside its quota
            if seen is None:
                seen = seen_of[inp.tenant] = (self._quota(j), self._quota_used.get(inp.tenant, 0))
            if j.quota_seen is None or j.quota_seen[0] is not j.idle or j.quota_seen[1] != seen:
                if (o := finish(j)) is not j.given:
                    j.given = o
                    out.append(o)
                j.quota_seen = (j.idle, seen)
        for job in unplain:
            if job.idle_plain:
                del self._unplain[job.id]
        woken_last = []
        """the sleepers tried this round that the next must look at again: those placed, or otherwise written"""
        for job in self._woken:
            if job.g or not self._asleep(job):
                woken_last.append(job)
            elif job.idle_plain:  # an attempt that failed leaves the record as it found it: it sleeps on as it is
                self._unplain.pop(job.id, None)
            else:
                self._unplain[job.id] = job
        self._woken_last = woken_last
        self._fall_dormant()
        self._ended = True
        return out

    def _make_awake(self, inp: JobIn, prepared: dict, record: _Job | None) -> _Job:
        """The job's record made for this round (`_prepare`), awake (`_awake`): a guarantee without the slack to
        give GPUs back asks for its minimum only (`_room_to_give_back`; a guarantee carried over asks what it asked,
        which `_carries` checked)."""
        job = self.jobs[inp.job_id] = self._prepare(inp, prepared, record)
        self._awake.append(job)
        if inp.guaranteed and not job.carried and job.want_g > max(1, job.min_g) and not self._room_to_give_back(job):
            job.want_g = max(1, job.min_g)
            self._tables(job)
        return job

    def _fall_asleep(self, job: _Job, kind: JobKind, version: int) -> None:
        """Keep a record asleep this round (`_sleeping`), listed under its kind at its model's version, and among
        those whose outcome is made again while its last one is not the plain one."""
        job.sleeping = True
        self._sleeping[job.id] = job
        # a kind's sleepers all sleep at its current version (a refit wakes them all); were one listed at an older
        # one, the next round would find the version changed and look at them all again
        self._sleep_kinds.setdefault(id(kind), (kind, version, set()))[2].add(job.id)
        if not job.idle_plain:
            self._unplain[job.id] = job
        if job.inp.guaranteed:  # outside its quota (`_asleep`): looked at again every round (`_wake_in_quota`)
            self._quota_sleepers[job.id] = job

    def _fall_awake(self, job: _Job) -> None:
        """A sleeper of the last round looked at again: out of the sleepers until it is found asleep again. Its key
        leaves the list of sleepers' keys at once (`_wake` would pass it over, at every round until the list is made
        again); found asleep again, it is listed again with a fresh key, in the same place (`_list_sleepers`)."""
        job.sleeping = False
        del self._sleeping[job.id]
        self._unplain.pop(job.id, None)
        self._quota_sleepers.pop(job.id, None)
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
        would fail at once (`_wake`).

        So is a guaranteed job the last round ran as best-effort outside its quota (`_privileged`), holding nothing,
        with the detail that says so and nothing else written: what the round makes of it depends also on its
        tenant's quota and what it has used, its type's margins and the clock (`_room_to_give_back`), which
        `_wake_in_quota` reads again every round before the guarantees are placed, waking it where any would differ."""
        inp = job.inp
        if inp.current or inp.running or job.g or job.g_on or job.c_on or job.mem_on or job.min_g:
            return False
        if job.best is not None or job.reason or job.privileged or job.forced or job.placed is not None:
            return False
        if inp.guaranteed:
            return (not self.fixed_resources and not job.min_c and job.detail is not None
                    and job.detail is job.quota_detail)
        return not job.detail

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
            failed = self._failed.get(self._repeat_key(job))
            if failed is None:
                self._schedule_job(job)
            else:  # answered at once from the round's failed attempts, as `_schedule_job` would (it may gather, and
                # holds nothing, runs nothing). Where its last outcome, handed over, says that (`_finish`'s own check;
                # a guarantee asleep says `quota`, no attempt's reason), `_finish` would give it again
                self.why[job.id] = failed
                idle = job.idle
                if (idle is not None and idle is job.given and idle.pending is not None and idle.pending[0] == failed
                        and idle.reason == "queued" and idle._detail is job.detail):
                    job.answered = now
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
        each node's GPUs, CPUs and memory, name -> position in the given order, the GPUs of all, the most of a node).
        Read only: a round copies what it changes."""
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
                sum(n.gpus for n in nodes), max((n.gpus for n in nodes), default=0))
        return held

    def _version(self, kind: JobKind) -> int:
        """The kind's memo key at its model's version (`PlanBook._key`): the same object until a refit, which comes
        only between rounds, so it is asked of the book once per kind a round (the round's jobs keep their kinds
        alive, and with them the ids it is kept by)."""
        version = self._versions.get(id(kind))
        if version is None:
            version = self._versions[id(kind)] = self.book._key(kind)
        return version

    def _backoff(self, inp: JobIn) -> float:
        """How many times the hold a job is held: 2^(n-1) for n changes within `hold_backoff_s`."""
        return self._factor(inp.recent_changes)

    def _factor(self, recent_changes: int) -> float:
        """`_backoff` of a job with `recent_changes` changes within `hold_backoff_s`."""
        if self.hold_backoff_s <= 0 or recent_changes <= 1:
            return 1.0
        return float(min(MAX_HOLD_FACTOR, 2 ** (recent_changes - 1)))

    def rest_hold(self, recent_changes: int = 0) -> float:
        """The hold of a running job with `recent_changes` changes within `hold_backoff_s` (`JobIn.recent_changes`):
        while its seconds since its last change are under it, a round holds it. With none (or one), the plain hold
        (`hold_s`, or twice the restart cost)."""
        hold = 2 * self.restart_cost_s if self.hold_s is None else self.hold_s
        factor = self._factor(recent_changes)
        return hold if factor == 1.0 else hold * factor

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
        and what it has seen change between rounds only). A key equal to the last one worked out for the type is
        that object (`_margins_last`): the records' keys, compared every round, are then most often the same object,
        which compares at once (a key holds the type's bounds, a tuple of pairs)."""
        name = kind.model.name
        key = self._margins_seen.get(name)
        if key is None:
            key = self._margins_now(kind)
            last = self._margins_last.get(name)
            if last is not None and last == key:
                key = last
            else:
                self._margins_last[name] = key
            self._margins_seen[name] = key
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
        version = self._version(kind)
        margins = self._margins_key(kind) if guaranteed else None
        held = prepared.get(inp.job_id) if prepared is not None else None
        if (held is not None and held[1] is version and record is not None and record.inp is inp
                and record.placed is not None and record.version is version and record.current_rows is not None
                and record.current_rows[0] is inp.current and record.current_rows[1] is inp.current_mem
                and record.whole and not (record.touched or record.forced or record.reason)
                and (not record.detail or record.detail is record.quota_detail)
                and (not inp.guaranteed and not record.privileged
                     or guaranteed and self._carries(record, held, margins))):
            # a job the last round placed on its current allocation and did not touch since, asking the same at the
            # same model version: its record is what this round makes of it, once placed the same way. A guarantee
            # its quota left out last round (`_privileged` wrote it the detail that says so, and nothing else) has
            # it taken off, as `_clear` would: this round's quotas say it again, with the same detail object
            self._prepared[inp.job_id] = held
            record.carried = True
            if record.detail:
                record.detail = {}
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

    def _carries(self, record: _Job, held: tuple, margins: tuple | None) -> bool:
        """For a running guarantee's record the last round left as it found it (`_prepare`): whether it asks what it
        asked then (the same type's margins, and as many GPUs: `_room_to_give_back` follows the clock), and if so, the
        record as `_prepare` makes it again (its guarantee's minimum, which running outside its quota took away, and
        its flag of a guarantee kept, which this round's quotas decide again). Its place in the slope index and the
        queue are then those the last round gave it (`_index_all`, `_sort_by_slope`)."""
        if held[6] != margins:
            return False
        demand = held[7]
        if self._asks(record, demand[3], demand[4]) != record.want_g:
            return False
        record.privileged = False
        if record.min_g != demand[4] or record.min_c != demand[5]:  # else its tables are those it has
            record.min_g, record.min_c = demand[4], demand[5]
            self._tables(record)
        return True

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
        """The job's slope tables up to its want and down to its minimum (the book's memo, at its kind's model version).
        A record keeps those it asked for at its version, CPUs per GPU and reference (`tables_memo`): a guaranteed job
        outside its quota asks for two pairs a round, the same round after round."""
        version, cpg, ref, want_g, min_g = job.version, job.cpg, job.ref, job.want_g, job.min_g
        memo = job.tables_memo
        if version is not None and memo is not None and memo[0] is version and memo[1] == cpg and memo[2] == ref:
            hit = memo[3].get((want_g, min_g))
            if hit is not None:
                job.up_tab, job.down_tab = hit
                return
        kind = job.inp.kind
        job.up_tab = self.book.memo(kind, ("up", cpg, ref, want_g), lambda: up_table(job.curve, want_g).tolist())
        job.down_tab = self.book.memo(kind, ("down", cpg, ref, min_g), lambda: down_table(job.curve, min_g).tolist())
        if version is not None:
            if memo is None or memo[0] is not version or memo[1] != cpg or memo[2] != ref or len(memo[3]) >= 4:
                memo = job.tables_memo = (version, cpg, ref, {})
            memo[3][(want_g, min_g)] = (job.up_tab, job.down_tab)

    def _sort_by_slope(self) -> list[tuple]:
        """The queue's keys, lowest first, each ending in its job: the jobs awake this round (`_asleep`), but those a
        guarantee placed.

        Most keys are last round's (a job placed as the last round left it keeps its key): they are taken in last
        round's order (`_queue_last`), and the few made again put in their places by bisection, where sorting the
        keys in the jobs' order compares each about log2(n) times, and sorting that run with the others after it
        compares each key of the run at least once (to find it in order). Where more were made again than one for
        every `_INSORT_SHARE` kept, they are put after the run and sorted with it. The keys are unique (a job's id is
        in its key), so the sorted list is the same whatever order they come in; but a slope that is not a number
        compares neither below nor above any other, and where one is (this round or last), the keys are sorted in the
        jobs' order, as they always were."""
        keyed, fresh, kept_keys = [], [], {}
        unordered = False
        for j in (*self._awake, *self._dormant.values()):
            if j.carried and not j.touched:  # placed as the last round left it, nothing written since: the same key
                key = j.queue_key
                keyed.append(key)
                kept_keys[j.id] = key
                continue
            if j.privileged and j.g and j.reason == "guarantee":
                continue
            cpu = self._cpu_slope_up(j) if j.g else 0.0
            up = j.up()
            key = j.queue_key = (-j.inp.priority, -up, -cpu, j.inp.order, j.id, 0, j)
            keyed.append(key)
            fresh.append(key)
            unordered = unordered or math.isnan(up) or math.isnan(cpu)
        last = getattr(self, "_queue_last", None)  # last round's queue, sorted (`_queue_unordered`: a key in it was)
        in_order = None
        if not unordered and last is not None and not self._queue_unordered:
            in_order = [k for k in last if kept_keys.get(k[4]) is k]  # last round's keys kept, in their order
        if in_order is not None and len(in_order) == len(kept_keys):  # every kept key was in it: none unordered
            if len(fresh) * _INSORT_SHARE <= len(in_order):  # a few made again: each put in its place by bisection
                fresh.sort()
                insort = bisect.insort
                for key in fresh:
                    insort(in_order, key)
                keyed = in_order
            else:
                keyed = in_order + fresh
                keyed.sort()
        else:
            if not unordered:
                unordered = any(math.isnan(k[1]) or math.isnan(k[2]) for k in kept_keys.values())
            keyed.sort()  # ids are unique: no comparison reaches the job itself
        self._queue_last, self._queue_unordered = keyed, unordered
        return keyed


def _let_go(record: _Job | None) -> None:
    """A record no round reads again (its job is gone): its queue and sleepers' keys, which hold the record, let go
    of. Else each pair would be a reference cycle, which only the garbage collector frees; without any, the record
    goes when the last key holding it does."""
    if record is not None:
        record.key = record.queue_key = None
