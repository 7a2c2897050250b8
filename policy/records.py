"""What the Rubick engine (`policy/engine.py`) is handed and answers, and the records a round works on: a node's
capacity (`NodeCap`), a job's input (`JobIn`) and outcome (`Outcome`), a job's record for the round (`_Job`), the
journal an attempt writes and undoes (`_Journal`), and the order an attempt's search reads the nodes in (`_Order`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from controlplane.events import Plan

from .curves import Best, JobKind, slope_down

EPS = 1e-9
"""slopes closer than this are equal"""


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
    given: Outcome | None = None
    """the outcome a round last gave of the record (`RubickEngine._round`): a round leaves out an outcome that is that
    object again, which the service holds already"""
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
    answered: int = -1
    """the round in which it was last tried while asleep and answered from the round's failed attempts with the
    reason its last outcome gives (`RubickEngine._wake`): that outcome is not made again"""
    version: int | None = None
    """its kind's memo key this round (`PlanBook._key`): the same object until its model is refitted"""
    placed_memo: tuple | None = None
    """(GPUs per node, CPUs per GPU, `version`, best plan) of the last placement `_place_current` read: a running
    job's is most often the same round after round"""
    cpu_memo: tuple | None = None
    """(GPUs per node, CPUs per GPU, `version`, reference, slope) of the last `RubickEngine._cpu_slope_up` worked out"""
    settled_memo: tuple | None = None
    """(the input, what else it was read at, {(GPUs per node, CPUs per GPU): `_Search._settle_entry`}): what settling
    an allocation reads of the plan book, for its own allocation (a running job that may gather nothing asks it round
    after round) and the larger ones its searches gathered (`_Search._refused_on`)"""
    running_memo: tuple | None = None
    """(the outcome, what it was made of) the record last gave holding GPUs: given again while it would say the
    same (a running job left as it runs, round after round), so the service sees at once that nothing changed"""
    finish_memo: tuple | None = None
    """(`placed`, the detail, the flag of a guarantee kept, the outcome, the GPUs its plan uses) as `_finish` last made a
    running job's outcome with nothing written since it was placed and its plan its current one: while it is placed
    the same way (the same `placed` object: carried over since) with the same detail and flag, that outcome is given
    again unless its quota state or pending reason moved"""
    meets_memo: tuple | None = None
    """(`best`, whether it keeps the guarantee) as `_Guarantees._privileged` last found for a running guarantee: read
    again while the record is carried over (its placement, best plan, reference and its type's margins the same)"""
    tables_memo: tuple | None = None
    """(`version`, CPUs per GPU, reference, {(want, minimum): (`up_tab`, `down_tab`)}) of what `RubickEngine._tables`
    worked out for the record: a guaranteed job outside its quota asks for the same two a round, round after round"""
    quota_detail: dict[str, str] | None = None
    """the detail the record was last given for running outside its quota (`_Guarantees._privileged`): given again
    while it says the same, so its outcome may be the last round's object"""
    asks_memo: tuple | None = None
    """(its `_prepare` answer, its input, the iterations left, the measured seconds per iteration, whether it runs,
    (lowest, highest) seconds since submission, the GPUs it asks for) of the last `_NodeIndex._asks_window`: a guarantee
    asleep outside its quota asks for those GPUs while its input says the same and its seconds since submission lie
    strictly between the two (`_Guarantees._wake_in_quota` asks it every round)"""
    fast_memo: tuple | None = None
    """(its normalised curve, the GPUs, its reference, the speed its curve gives on them) as
    `_NodeIndex._deadline_terms` last read it: a running guarantee carried over is asked it every round"""
    quota_seen: tuple | None = None
    """(the outcome, (its tenant's quota, what the round used of it)) a guarantee asleep outside its quota, not tried,
    last gave (`RubickEngine._round`). That is all of it a round can change while it sleeps (its pending reason says
    both): while its last outcome is that object and neither moved, `_finish` would give it again, and the round
    leaves it out"""
    touched: bool = False
    """whether a journal wrote one of its attributes since `_place_current` placed it (`_Journal.attr`): while not,
    it holds what it was placed on, and `placed` says what that is"""
    carried: bool = False
    """its record carried over as the last round left it (`_prepare`): `_place_current` places it without writing
    it, or makes it again where it no longer fits (and the flag goes)"""
    index_key: tuple | None = None
    """its key in the slope index as the round began (None: not listed), from `_index_all`: a record carried over
    has the key it had, but a guarantee kept (`index_priv`)"""
    queue_key: tuple | None = None
    """its key in the round's queue as `_sort_by_slope` last made it: a record carried over and not touched since
    has the key it had (its priority, GPUs, slope tables and placement are the same)"""
    quiet: bool | str | None = None
    """as the record holding GPUs was last finished (`_Dormant._quiet`): True where `_finish` would give its last
    outcome again whatever the round, the pending reason with which it would, or None"""
    quiet_priv: bool = False
    """its flag of a guarantee kept when `quiet` was worked out: read only while it is the same"""
    index_priv: bool = False
    """whether `index_key` was made for the record as a guarantee kept (`privileged`): such a key reads the clock
    (`_NodeIndex._keeps_guarantee`), and is made again every round"""
    index_nodes: tuple[str, ...] = ()
    """the nodes `index_key` is listed under (its GPUs' nodes, in its allocation's order), kept with it"""
    whole: bool = False
    """whether `_place_current` placed it on every part of its current allocation as asked, nothing cut"""
    current_rows: tuple | None = None
    """(its input's `current`, its `current_mem`, [(node, GPUs, CPUs, memory or None)] by node): what
    `_place_current` reads of them, made again when either is another object"""

    def up(self) -> float:
        return self.up_at(self.g)

    def down(self) -> float:
        return self.down_at(self.g)

    def up_at(self, g: int) -> float:
        """The job's slope up at `g` GPUs (`up` at the GPUs it holds; a search asks it at those it would hold)."""
        if g >= self.want_g or g >= len(self.up_tab):
            return 0.0
        return self.up_tab[g]

    def down_at(self, g: int) -> float:
        """The job's slope down at `g` GPUs (`down` at the GPUs it holds)."""
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
