"""A flow-level network simulator (fluid model, event-driven).

Each job repeats one iteration, a small task graph (`Pattern`): compute tasks (a fixed duration on
the job's own GPUs, never contended) and flows (bytes between two nodes, contended on the links they
cross). A task starts when every task it comes after has finished; an iteration starts when the
previous one has finished. Between two events (a flow released or finished, a compute task finished)
every flow moves at a constant rate, the rates the network scheduler (`rates.allocate`) gives the
flows active then; the simulator jumps from event to event and asks again.

Each flow belongs to an EchelonFlow instance (the pattern's EchelonFlow in one iteration): its
reference time r is the release of the instance's first flow, its ideal finish time r + offset;
the instance's tardiness is the largest (finish - ideal finish) of its flows (Eq. S2).
Pure code: no I/O, no wall clock; ties are broken by a sequence number, so results are exact
repeats for the same inputs.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .rates import Active, allocate
from .topology import Network, NetworkError

DONE_EPS = 1e-9
"""A flow with at most this fraction of its bytes left has finished (rounding)."""


@dataclass(frozen=True)
class Task:
    after: tuple[int, ...] = ()
    """indices (in the pattern) of the tasks that must finish first"""
    duration: float = 0.0
    """compute task: seconds"""
    src: str = ""
    dst: str = ""
    size: float = 0.0
    """flow: bytes (a task with a size is a flow)"""
    echelon: int = -1
    """flow: the pattern's EchelonFlow it belongs to"""
    offset: float = 0.0
    """flow: ideal finish time - the EchelonFlow instance's reference time"""

    @property
    def is_flow(self) -> bool:
        return self.size > 0


@dataclass(frozen=True)
class Pattern:
    """One iteration of one job."""

    job: str
    tasks: tuple[Task, ...]
    echelons: tuple[str, ...] = ()
    """what each EchelonFlow is (`pipeline fwd 0->1`, `dp all-reduce stage 0`, ...)"""
    weight: float = 1.0
    klass: int = 0

    def check(self, network: Network) -> None:
        if not self.tasks:
            raise NetworkError(f"job {self.job}: an iteration with no tasks")
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise NetworkError(f"job {self.job}: weight must be a finite number > 0, got {w!r}")
        if isinstance(self.klass, bool) or not isinstance(self.klass, int) or self.klass < 0:
            raise NetworkError(f"job {self.job}: traffic class must be a whole number >= 0, got {self.klass!r}")
        for i, t in enumerate(self.tasks):
            if any(not 0 <= a < i for a in t.after):
                raise NetworkError(f"job {self.job} task {i}: it may come only after earlier tasks")
            if (t.src or t.dst) and not (isinstance(t.size, (int, float)) and t.size > 0 and math.isfinite(t.size)):
                raise NetworkError(f"job {self.job} task {i}: a flow ({t.src}->{t.dst}) needs a finite size > 0 "
                                   f"bytes, got {t.size!r}")
            if t.is_flow:
                if not math.isfinite(t.size):
                    raise NetworkError(f"job {self.job} task {i}: flow size must be finite, got {t.size!r}")
                if not 0 <= t.echelon < len(self.echelons):
                    raise NetworkError(f"job {self.job} task {i}: unknown EchelonFlow {t.echelon}")
                network.path(t.src, t.dst)  # unknown nodes / a flow to itself
                if not math.isfinite(t.offset) or t.offset < 0:
                    raise NetworkError(f"job {self.job} task {i}: offset must be finite and >= 0")
            elif not (t.size == 0 and math.isfinite(t.duration) and t.duration >= 0):
                raise NetworkError(f"job {self.job} task {i}: a compute task needs finite seconds >= 0 and no bytes, "
                                   f"got duration {t.duration!r}, size {t.size!r}")

    @property
    def flows(self) -> list[Task]:
        return [t for t in self.tasks if t.is_flow]


@dataclass
class FluidResult:
    end_s: float
    iterations: dict[str, list[float]] = field(default_factory=dict)
    """job -> seconds of each iteration it finished"""
    finished: dict[str, float] = field(default_factory=dict)
    """job -> time its last iteration finished (its completion time)"""
    tardiness: list[tuple[str, int, int, float]] = field(default_factory=list)
    """(job, iteration, EchelonFlow index, tardiness s) of every finished EchelonFlow instance"""
    flow_finish: list[tuple[str, int, int, float]] = field(default_factory=list)
    """(job, iteration, task index, finish time) of every flow"""
    decisions: int = 0
    """how many times the scheduler was asked for rates"""

    def total_tardiness(self) -> float:
        return float(sum(max(t, 0.0) for *_, t in self.tardiness))

    def mean_iteration(self, job: str, skip: int = 0) -> float:
        its = self.iterations.get(job, [])[skip:]
        return float(np.mean(its)) if its else math.inf


@dataclass
class _Run:
    pattern: Pattern
    succ: list[list[int]]
    sizes: dict[int, int]
    """EchelonFlow index -> how many flows it has in one iteration"""
    iteration: int = 0
    began: float = 0.0
    waiting: list[int] = field(default_factory=list)
    left: int = 0
    ref: dict[int, float] = field(default_factory=dict)
    late: dict[int, float] = field(default_factory=dict)
    closed: dict[int, int] = field(default_factory=dict)


def simulate(network: Network, patterns: Sequence[Pattern], mode: str, *, iterations: int = 3,
             starts: Sequence[float] | None = None, horizon_s: float = math.inf,
             max_events: int = 5_000_000) -> FluidResult:
    """Run every job's iterations against each other until each has finished `iterations` of them (or
    `horizon_s`). `starts`: when each job's first iteration starts (default 0 for all)."""
    return _Sim(network, patterns, mode, iterations, starts, horizon_s, max_events).run()


class _Sim:
    def __init__(self, network: Network, patterns: Sequence[Pattern], mode: str, iterations: int,
                 starts: Sequence[float] | None, horizon_s: float, max_events: int) -> None:
        if iterations < 1:
            raise ValueError("iterations must be >= 1")
        names = [p.job for p in patterns]
        if len(set(names)) != len(names):
            raise NetworkError("each job may appear once")
        for p in patterns:
            p.check(network)
        self.network, self.mode, self.iterations = network, mode, iterations
        self.horizon_s, self.max_events = horizon_s, max_events
        self.starts = [0.0] * len(patterns) if starts is None else [float(s) for s in starts]
        if len(self.starts) != len(patterns):
            raise ValueError("one start time per job")
        bad = [p.job for p, s in zip(patterns, self.starts) if not math.isfinite(s) or s < 0]
        if bad:
            raise ValueError(f"start times must be finite and >= 0 (jobs {', '.join(bad)})")
        self.runs: list[_Run] = []
        for p in patterns:
            succ: list[list[int]] = [[] for _ in p.tasks]
            sizes: dict[int, int] = {}
            for i, t in enumerate(p.tasks):
                for a in t.after:
                    succ[a].append(i)
                if t.is_flow:
                    sizes[t.echelon] = sizes.get(t.echelon, 0) + 1
            self.runs.append(_Run(p, succ, sizes))
        self.result = FluidResult(0.0, {p.job: [] for p in patterns})
        self.K = 4 if network.rack_size else 2
        self.paths: dict[tuple[str, str], tuple[int, ...]] = {}
        self.flows: list[list] = []  # [run, iteration, task, remaining, size, deadline, group, class, path]
        self.groups: dict[tuple[int, int, int], int] = {}
        self.timers: list[tuple[float, int, int, int]] = []  # (time, seq, run, task)
        self.seq = 0
        self.now = 0.0

    # --- tasks ---------------------------------------------------------------------------------

    def begin(self, ri: int) -> list[tuple[int, int]]:
        run = self.runs[ri]
        run.began = self.now
        run.waiting = [len(t.after) for t in run.pattern.tasks]
        run.left = len(run.pattern.tasks)
        run.ref, run.late, run.closed = {}, {}, {}
        return [(ri, i) for i, t in enumerate(run.pattern.tasks) if not t.after]

    def release(self, ri: int, ti: int) -> None:
        run = self.runs[ri]
        task = run.pattern.tasks[ti]
        if not task.is_flow:
            self.seq += 1
            heapq.heappush(self.timers, (self.now + task.duration, self.seq, ri, ti))
            return
        e = task.echelon
        ref = run.ref.setdefault(e, self.now)
        key = (ri, run.iteration, e)
        group = self.groups.setdefault(key, len(self.groups))
        path = self.paths.get((task.src, task.dst))
        if path is None:
            path = self.network.path(task.src, task.dst)
            path = self.paths[(task.src, task.dst)] = path + (self.network.links,) * (self.K - len(path))
        self.flows.append([ri, run.iteration, ti, float(task.size), float(task.size), ref + task.offset, group,
                           run.pattern.klass, path])

    def finish(self, ri: int, ti: int) -> list[tuple[int, int]]:
        run = self.runs[ri]
        out = []
        for s in run.succ[ti]:
            run.waiting[s] -= 1
            if run.waiting[s] == 0:
                out.append((ri, s))
        run.left -= 1
        if run.left == 0:
            self.result.iterations[run.pattern.job].append(self.now - run.began)
            run.iteration += 1
            if run.iteration >= self.iterations:
                self.result.finished[run.pattern.job] = self.now
            else:
                out.extend(self.begin(ri))
        return out

    def flow_done(self, flow: list) -> None:
        ri, it, ti = flow[0], flow[1], flow[2]
        run = self.runs[ri]
        e = run.pattern.tasks[ti].echelon
        self.result.flow_finish.append((run.pattern.job, it, ti, self.now))
        run.late[e] = max(run.late.get(e, -math.inf), self.now - flow[5])
        run.closed[e] = run.closed.get(e, 0) + 1
        if run.closed[e] == run.sizes[e]:
            self.result.tardiness.append((run.pattern.job, it, e, run.late[e]))

    # --- the loop ------------------------------------------------------------------------------

    def rates(self) -> np.ndarray:
        f = self.flows
        weights = np.ones(len(self.groups))
        incurred = np.zeros(len(self.groups))
        for (ri, it, e), g in self.groups.items():
            run = self.runs[ri]
            weights[g] = run.pattern.weight
            if it == run.iteration:
                incurred[g] = run.late.get(e, 0.0)
        active = Active(self.network.capacity, np.asarray([x[8] for x in f], dtype=np.int64),
                        np.asarray([x[3] for x in f]), np.asarray([x[5] for x in f]),
                        np.asarray([x[6] for x in f], dtype=np.int64), weights,
                        np.asarray([x[7] for x in f], dtype=np.int64), incurred)
        self.result.decisions += 1
        return allocate(self.mode, active, self.now)

    def run(self) -> FluidResult:
        order = sorted(range(len(self.runs)), key=lambda i: (self.starts[i], i))
        started = 0
        events = 0
        rates = np.zeros(0)
        dirty = True
        while True:
            ready: list[tuple[int, int]] = []
            while started < len(order) and self.starts[order[started]] <= self.now:
                ready.extend(self.begin(order[started]))
                started += 1
            while ready or (self.timers and self.timers[0][0] <= self.now):
                for ri, ti in ready:
                    self.release(ri, ti)
                ready = []
                while self.timers and self.timers[0][0] <= self.now:
                    _, _, ri, ti = heapq.heappop(self.timers)
                    ready.extend(self.finish(ri, ti))
                dirty = True
            if len(self.result.finished) == len(self.runs):
                break
            if dirty:
                rates = self.rates() if self.flows else np.zeros(0)
                dirty = False
            t_flow, first = math.inf, -1
            if self.flows:
                rem = np.asarray([x[3] for x in self.flows])
                eta = np.full(len(rem), math.inf)
                moving = rates > 0
                eta[moving] = rem[moving] / rates[moving]
                first = int(np.argmin(eta))
                t_flow = self.now + float(eta[first])
            t_timer = self.timers[0][0] if self.timers else math.inf
            t_start = self.starts[order[started]] if started < len(order) else math.inf
            t_next = min(t_flow, t_timer, t_start)
            if not math.isfinite(t_next):
                if self.flows or self.timers:
                    raise RuntimeError("fluid simulation stuck: flows left but none can move")
                break
            if t_next > self.horizon_s:
                break
            events += 1
            if events > self.max_events:
                raise RuntimeError(f"fluid simulation exceeded {self.max_events} events")
            dt = t_next - self.now
            self.now = t_next
            if self.flows:
                keep, done = [], []
                for i, (x, r) in enumerate(zip(self.flows, rates.tolist())):
                    x[3] -= r * dt
                    if i == first and t_flow <= t_next or x[3] <= DONE_EPS * x[4]:
                        done.append(x)
                    else:
                        keep.append(i)
                if done:
                    self.flows = [self.flows[i] for i in keep]
                    rates = rates[keep]
                    dirty = True
                    for x in done:
                        self.flow_done(x)
                        ready.extend(self.finish(x[0], x[2]))
            for ri, ti in ready:
                self.release(ri, ti)
            if ready:
                dirty = True
        self.result.end_s = self.now
        return self.result
