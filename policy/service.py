"""The policy core: folds events, runs scheduling rounds, publishes `plan.decided`.

A round runs on every accepted `job.submitted`, `job.completed`, `job.failed`, `node.registered`,
`node.lost`, `model.updated` and owner's request (`job.cancel`, `job.suspend`, `job.resume`: a cancelled or
suspended job's resources are withdrawn in that round, with the reason `cancelled` or `suspended`); a `clock.tick` runs one only when something changed since the
last round (a preemption, a restart, new measurements), so an idle cluster costs nothing. A round's
`plan.decided` lists only the jobs whose allocation or plan changed; nothing is published when
nothing changed.

Batching (`batch_s`, default 0 here and 60 s from `policy.registry.make_policy`): while clock ticks
arrive at most `batch_s` apart, a best-effort submission made when no GPU is free, and a
`model.updated`, within `batch_s` of the last round wait for the next round (the next tick's at the
latest) instead of running one each. On a full cluster, a burst of submissions then costs one round
instead of one per job; a guaranteed submission, a completion, a failure and a node change still
run a round at once, and so does a submission that free GPUs could start.

A job no plan can run on the cluster at any size (too big even with ZeRO-Offload on every GPU) is
refused with `job.rejected` naming why, never left queued silently.

Pure core (DESIGN.md): time comes from the events, iteration is in stable order, the event ids of
what it publishes are derived from the round number, so replaying the same inputs reproduces
every `plan.decided` byte for byte.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping

from controlplane.events import Decision, Event, NodeShare, PlanDecided, Rejected, make
from controlplane.events.payloads import Pending, PlanPending
from controlplane.state import ClusterState, JobState
from modeler.spec import ModelType, SpecError

from .curves import JobKind, packed
from .engine import JobIn, NodeCap, Outcome
from .oracle import ModelOracle, Oracle
from .plans import ALL_FAMILIES

ROUND_NOW = frozenset({"job.submitted", "job.completed", "job.failed", "node.registered", "node.lost",
                       "model.updated", "job.cancel", "job.suspend", "job.resume", "job.priority", "quota.set"})
WITHDRAWN = {"cancelled": "cancelled", "suspended": "suspended"}
"""Job states an owner's request put a job in -> the reason of the decision that takes its resources."""
DIRTY = frozenset({"job.preempted", "job.started", "job.reconfigured", "metrics.iteration"})
KEEPS_INPUTS = frozenset({"clock.tick", "model.updated", "node.registered", "node.heartbeat", "plan.pending",
                          "quota.set", "run.described"})
"""Events about no one job that change nothing `PolicyCore.job_in` reads but what `_inputs` brings forward."""
SCHEDULED = ("queued", "running", "preempted")
"""The statuses of the jobs a round hands the engine."""
KEEPS_FREE = frozenset({"job.submitted", "metrics.iteration", "clock.tick", "model.updated", "plan.pending"})
"""Events that change no decided allocation, no open job's status and no node's life: `_free_gpus` stays."""


@dataclass
class Progress:
    """What the core knows of a job's progress: `iterations` done at time `at`, and the measured
    time of one iteration since (None while the job restarts or has not reported on its current
    configuration yet: then no progress is assumed after `at`)."""
    iterations: int = 0
    at: float = 0.0
    iter_time_s: float | None = None


_NO_PROGRESS = Progress()


@dataclass
class PolicyCore:
    """`policy`: one of `policy.registry.POLICIES`, built by `make_policy`."""

    policy: str
    engine: object
    """has `schedule(nodes, jobs) -> list[Outcome]` and a `book` (PlanBook)."""
    kind_of: Callable[[ModelType, int, object], JobKind]
    models: dict[str, ModelType]
    oracle: Oracle
    name: str = "policy"
    subjects: tuple[str, ...] = ("job.>", "node.>", "metrics.iteration", "metrics.iteration.>", "model.updated",
                                  "clock.tick", "quota.set")
    state: ClusterState = field(default_factory=ClusterState)
    progress: dict[str, Progress] = field(default_factory=dict)
    round: int = 0
    dirty: bool = False
    order: dict[str, int] = field(default_factory=dict)
    last: dict[str, Outcome] = field(default_factory=dict)
    changed_at: dict[str, float] = field(default_factory=dict)
    changes: dict[str, list[float]] = field(default_factory=dict)
    """job -> when decisions changed its allocation or plan, within the engine's `hold_backoff_s`"""
    """job -> time of the last decision that changed it"""
    ref_iter: dict[str, float] = field(default_factory=dict)
    """guaranteed job -> its first measured iteration running its request as asked (`JobIn.ref_iter_s`)"""
    batch_s: float = 0.0
    """see the module docstring; 0 = a round on every submission and model update"""
    last_round_at: float = -math.inf
    tick_period_s: float = 0.0
    """the period the last clock.tick announced (0 = no tick seen: nothing may wait, and no job is
    held (`RubickEngine.hold_s`), since no tick would come to run the round a wait or a hold put off)"""
    pending: dict[str, Pending] = field(default_factory=dict)
    """job -> its pending reason as last published on `plan.pending`"""
    pending_seq: int = 0
    """`plan.pending` events published (their ids count them)"""
    reasons: bool = True
    """Publish `plan.pending`; off only to measure what it costs (bench/policy_round.py)."""
    default_support: object = None
    """The plan features of jobs without a workload (`PlanSupport`): the example trainer's where real agents
    run them (`controlplane.events.workload.EXAMPLE_TRAINER`); None where they are simulated (any plan)."""
    _kinds: dict = field(default_factory=dict, repr=False)
    _job_kinds: dict = field(default_factory=dict, repr=False)
    """job -> (model, support, kind): its `_kind`, looked up again only when its model or support object changes"""
    _shapes: dict = field(default_factory=dict, repr=False)
    """job -> (its decided allocation, node -> (GPUs, CPUs), node -> memory): `JobIn.current` and `current_mem`,
    rebuilt only when a decision replaces the allocation"""
    _runs: dict = field(default_factory=dict, repr=False)
    _made: dict = field(default_factory=dict, repr=False)
    """job -> ((reason, GPUs, needs, detail), the `Pending` made of them, the outcome they came from) in the last
    round"""
    _free: int | None = field(default=None, repr=False)
    """`_free_gpus`, until an event that may change it (not one of `KEEPS_FREE`) or a round"""
    _caps: tuple | None = field(default=None, repr=False)
    """(the state's live nodes, the engine's `NodeCap` of each): made again only when the live nodes change, so a
    round hands the engine the same node objects (`RubickEngine._layout` then reads them at once)"""
    _holding: set = field(default_factory=set, repr=False)
    """jobs whose last decision gave them resources (`last` with shares): the only ones `_count_free` reads"""
    _used_of: dict = field(default_factory=dict, repr=False)
    """job -> GPUs of live nodes its decision holds, as `_count_free` last counted them (none: it holds none)"""
    _used: int = field(default=0, repr=False)
    """the sum of `_used_of`"""
    _used_alive: frozenset | None = field(default=None, repr=False)
    """the live nodes' names `_used_of` was counted on"""
    _recount: set | None = field(default=None, repr=False)
    """jobs whose entry in `_used_of` may have changed since `_count_free` last ran; None: every job is counted
    again"""
    _stopped: set = field(default_factory=set, repr=False)
    """jobs cancelled or suspended by their owner whose resources a round may still have to withdraw"""
    _kept_in: dict = field(default_factory=dict, repr=False)
    """job -> its `JobIn` as last built. While nothing happens to the job only the fields that follow the clock, its
    measured progress and its status change, so the next round takes the same object with those brought forward
    (`_inputs`); an event about the job (but a measured iteration), a decision that changes it and an event about
    no one job that may change some (`KEEPS_INPUTS`) drop it."""

    _listed: dict | None = field(default=None, repr=False)
    """job -> the input a round hands the engine, kept between rounds where the engine reads no clock field of a
    waiting best-effort job (`waiting_clock` False); None: made again from every open job at the next round"""
    _stale: set = field(default_factory=set, repr=False)
    """jobs whose entry in `_listed` the next round makes again (or drops): those `_kept_in` dropped, and those that
    had no input"""
    _unasked: bool = field(default=False, repr=False)
    """whether the last round had no live node to ask the engine about"""
    _touched: set | None = field(default=None, repr=False)
    """jobs whose entry in `_listed` was made again or dropped since the engine was last handed `_listed`: what an
    engine that takes them (`RubickEngine.schedule_changed`) needs to look at, besides its own; None: not known
    (`_listed` was made again whole), and every input is looked at"""
    _moving: dict = field(default_factory=dict, repr=False)
    """job -> (its input in `_listed`, its state) for the jobs whose inputs move with the clock (running or
    guaranteed): brought forward every round. A job's state object is replaced only by an event about it, which
    makes its entry again"""
    _still: dict = field(default_factory=dict, repr=False)
    """job -> (its input in `_listed`, its submission time, the time of its last change, its state) for the waiting
    guaranteed jobs whose inputs move with the clock alone: holding nothing, not running, with no change within the
    engine's `hold_backoff_s`. Their seconds since submission and since their last change are brought forward, the
    rest stays as the round that listed them brought it (only an event about the job changes it, which lists it again,
    or a measured iteration, which hands it back to `_moving`)"""
    _resting: dict = field(default_factory=dict, repr=False)
    """job -> (its input in `_listed`, its state, the time its hold surely lasts to) for running jobs the engine keeps
    dormant (`RubickEngine.fell_dormant`), taken out of `_moving`: their inputs are not brought forward while a round's
    time is under that (the engine reads none of their fields that follow the clock before it asks, `_wake_resting`).
    An event about the job, or that time passed, hands it back to `_moving`"""
    _rest_ends: list = field(default_factory=list, repr=False)
    """(the time its hold surely lasts to, job) of each entry put in `_resting`, a heap; entries no longer there (or
    put there again since) are passed over"""
    _rested: list = field(default_factory=list, repr=False)
    """the jobs whose rest ended at the round under way (`_rest_over`): they rest again after it if still dormant"""
    _round_t: float = 0.0
    """the time of the round under way: `_wake_resting` brings inputs forward to it"""
    _folded: int = field(default=-1, repr=False)
    """the state's count of events applied (`ClusterState.events`) after the core's own last one: a count that
    differs means events applied to the state past `handle` (a benchmark timing rounds alone does), which `_stale`
    did not see, and `_listed` is made again whole"""

    def __post_init__(self) -> None:
        self.state.known_models |= set(self.models)
        quotas = getattr(self.engine, "quotas", None)  # what its run.described tells admission
        self.state.start_quotas = dict(quotas) if quotas is not None else None

    # --- events ---------------------------------------------------------------------------
    def handle(self, event: Event) -> list[Event]:
        return self._handle(event, True)

    def fold(self, event: Event) -> list[Event]:
        """`handle` without the round the event would run: everything else it does (the state folded, the job's
        input marked to be made again, a submission refused or said to wait), and a round marked due, which the
        next `run_round` or `clock.tick` runs. For a driver that hands over several events and then asks for one
        round (`bench/policy_round.py`: a completion and a submission, then a round): that round makes again only
        the inputs of the jobs they touched, as a deployed core's rounds do."""
        return self._handle(event, False)

    def _handle(self, event: Event, rounds: bool) -> list[Event]:
        base = event.base
        if base == "plan.decided" or self.state.refusal(event) is not None:
            return []  # a node's report on a job not placed on it changes nothing (admission answers it)
        known_before = event.payload.job_id in self.state.jobs if base == "job.submitted" else False
        self._apply(event, True)  # not refused, as just found
        about = getattr(event.payload, "job_id", None)
        if about:
            if base != "metrics.iteration":  # what it changes is brought forward every round
                self._kept_in.pop(about, None)
                self._stale.add(about)
            elif about in self._still:  # its progress or measured speed may have moved: all of it brought forward
                inp, _, _, js = self._still.pop(about)
                self._moving[about] = (inp, js)
        elif base not in KEEPS_INPUTS:
            self._kept_in.clear()  # an event about no one job that may change some (a node lost stops its jobs)
            self._listed = None
        if base not in KEEPS_FREE:
            self._free = None
            if about:
                self._count_again(about)
            else:  # an event about no one job (a node lost stops the jobs on it): every job counted again
                self._recount = None
        if base in ("job.cancel", "job.suspend"):
            self._stopped.add(about)
        out: list[Event] = []
        if base == "job.submitted":
            job = self.state.jobs.get(event.payload.job_id)
            if job is None or known_before:
                return []
            self.order[job.job_id] = len(self.order)
            verdict = self._cannot_run(job, event)
            if verdict is not None:
                why, where, expected, got = verdict
                self.state.jobs.pop(job.job_id, None)
                self.state.rejected[job.job_id] = why
                return [make("job.rejected", Rejected(subject="job.submitted", reason=why, field=where,
                                                      expected=expected, got=got, event_id=event.id,
                                                      job_id=job.job_id),
                             time=event.time, id=f"policy-rej-{event.id}", source=self.name)]
        elif base == "model.updated" and isinstance(self.oracle, ModelOracle):
            self.oracle.update(event.payload)
        elif base == "metrics.iteration":
            m = event.payload
            p = self.progress.setdefault(m.job_id, Progress())
            p.iterations, p.at, p.iter_time_s = max(p.iterations, m.iteration + 1), event.time, m.iter_time_s
            self._observe(m)
        elif base in ("job.started", "job.reconfigured"):
            p = self.progress.setdefault(event.payload.job_id, Progress())
            p.at, p.iter_time_s = event.time, None  # its speed on the new configuration is not known yet
        elif base == "job.preempted":
            p = self.progress.setdefault(event.payload.job_id, Progress())
            p.iterations, p.at = max(p.iterations, event.payload.iterations_done), event.time
        elif base == "clock.tick":
            self.tick_period_s = float(event.payload.period_s)
        elif base == "quota.set" and self.state.quota_refusal(event.payload) is None:
            # applied by the fold (admission's checks passed): the engine charges guaranteed jobs to it from now on
            if hasattr(self.engine, "quotas"):
                self.engine.quotas = self.state.quotas()
        if base in ("job.completed", "job.failed"):
            self._drop(event.payload.job_id)
        if rounds and ((base in ROUND_NOW and not self._may_wait(event)) or (base == "clock.tick" and self.dirty)):
            out.extend(self.run_round(event))
        elif base in DIRTY or base in ROUND_NOW:
            self.dirty = True
            if base == "job.submitted" and self.reasons:  # batched: it waits for the next round, and says so
                job = self.state.jobs[event.payload.job_id]
                out.extend(self._publish_pending(event, {job.job_id: Pending(job_id=job.job_id, reason="batch")},
                                                 ()))
        if base == "job.cancel":  # its withdrawal is decided (above): nothing of it stays
            self._drop(event.payload.job_id)
        return out

    def _apply(self, event: Event, checked: bool = False) -> None:
        """Fold an event into the state, noting whether others were folded past the core since its last one.
        `checked`: found not refused just before (`ClusterState.apply`)."""
        state = self.state
        if state.events != self._folded:
            self._listed = None
            self._recount = None  # what the events folded past the core changed is not known
        state.apply(event, checked)
        self._folded = state.events

    def _drop(self, job_id: str) -> None:
        """Forget what the core keeps of a job that is over."""
        for table in (self.last, self.changed_at, self.changes, self.ref_iter, self.progress, self._shapes,
                      self._job_kinds, self._kept_in, self._resting):
            table.pop(job_id, None)
        self._holding.discard(job_id)

    def _may_wait(self, event: Event) -> bool:
        """Whether a round-triggering event may wait for the next round (see Batching above)."""
        if self.batch_s <= 0 or not 0 < self.tick_period_s <= self.batch_s:
            return False
        if event.time - self.last_round_at >= self.batch_s:
            return False
        if event.base == "model.updated":
            return True
        if event.base != "job.submitted":
            return False
        job = self.state.jobs.get(event.payload.job_id)
        return job is not None and not job.guaranteed and self._free_gpus() <= 0

    def _free_gpus(self) -> int:
        """GPUs of live nodes no decision holds (`last` has every job a round has seen that is not over)."""
        if self._free is None:
            self._free = self._count_free()
        return self._free

    def _count_free(self) -> int:
        """The live nodes' GPUs less those the jobs in `_holding` (open) were decided on them. What each job holds is
        kept between counts (`_used_of`), and only the jobs an event or a decision touched since (`_recount`) are
        counted again: an event folds changes into the state of the job it is about alone (`ClusterState.apply`;
        the others that may change what is held, a node lost among them, count every job again, as does a new set of
        live nodes, or events folded past the core). A large cluster's round is followed by a submission that asks
        this, with thousands of jobs holding GPUs."""
        state = self.state
        alive = state.alive_names()
        recount, used_of, holding, jobs = self._recount, self._used_of, self._holding, state.jobs
        if recount is None or alive is not self._used_alive or state.events != self._folded:
            used_of.clear()
            self._used, self._used_alive, recount = 0, alive, holding
        used = self._used
        for job_id in recount:  # a job holds what it was decided only while its last decision gave it some
            used -= used_of.pop(job_id, 0)
            job = jobs.get(job_id) if job_id in holding else None
            if job is not None and job.status in SCHEDULED:
                n = sum(s.gpus for s in job.decided_allocation if s.node in alive)
                if n:
                    used_of[job_id] = n
                    used += n
        self._used, self._recount = used, set()
        return state.totals()[0] - used

    def _count_again(self, job_id: str) -> None:
        """What the job holds is counted again at the next `_count_free`. A core whose submissions never ask
        (batching off, or only guarantees submitted) would gather every job it ever saw: past one more than twice
        the jobs holding GPUs, every job is counted again instead, which costs no more."""
        recount = self._recount
        if recount is not None:
            recount.add(job_id)
            if len(recount) > 2 * len(self._holding) + 1:
                self._recount = None

    def _pause(self, job_id: str, t: float) -> None:
        """A running job the round changes stops at `t` to restart: count its progress up to `t` and
        assume none after it until it reports from its new configuration."""
        p = self.progress.get(job_id)
        if p is None:
            return
        if p.iter_time_s and t > p.at:
            p.iterations += int((t - p.at) / p.iter_time_s)
        p.at, p.iter_time_s = t, None

    def _observe(self, m) -> None:
        """A measured iteration tells the oracle how far its predictions for the type can be trusted
        (`ModelOracle.observe`); the next tick's round uses it (a measurement marks the core dirty).
        A guaranteed job's first iteration run as asked fixes the speed its deadline is counted at."""
        observe = getattr(self.oracle, "observe", None)
        job = self.state.jobs.get(m.job_id)
        if (job is not None and job.guaranteed and m.job_id not in self.ref_iter and m.iter_time_s > 0
                and math.isfinite(m.iter_time_s) and _as_asked(job, m, self.engine.book.node_gpus)):
            self.ref_iter[m.job_id] = float(m.iter_time_s)
        model = self.model_of(job) if job is not None and job.model_type == m.model_type else None
        if observe is None or model is None:
            return
        observe(model, job.global_batch_size, tuple(m.gpus_per_node), m.cpus_per_gpu, m.plan, m.iter_time_s)

    # --- what a job is to the engine ------------------------------------------------------------
    def model_of(self, job: JobState) -> ModelType | None:
        model = self.models.get(job.model_type)
        if model is None and job.spec is not None:
            model = ModelType(spec=job.spec)
            self.models[job.model_type] = model
        return model

    def _cannot_run(self, job: JobState, event: Event) -> tuple[str, str, str, str] | None:
        """(reason, field, expected, got) when the job can never run here (refused at submission)."""
        model = self.model_of(job)
        if model is None:
            return (f"unknown model type {job.model_type!r}", "data.model.type", "one of " +
                    ", ".join(sorted(self.models)), job.model_type)
        try:
            model.fwd_time_s
        except SpecError as exc:
            return (f"{exc}; profile the model type first (rubick profile)", "data.model.spec.fwd_time_s",
                    "a profiled forward time", "nothing")
        book = self.engine.book
        # whether any plan at all runs it: a policy with a narrower plan space falls back to the request
        kind = JobKind(model, job.global_batch_size, ALL_FAMILIES, support=self._support(job))
        least = self.state.least_cpus_per_gpu()
        cpg = min(max(1, book.max_cpus_per_gpu if least is None else least), book.max_cpus_per_gpu)
        key = (job.model_type, job.global_batch_size, cpg, book.max_gpus, self._support(job))
        runs = self._runs.get(key)  # memory alone decides it, not the fitted speeds: once per kind
        if runs is None:
            runs = self._runs[key] = bool(book.gpu_curve(kind, cpg).max() > 0 or book.gpu_curve(kind, 1).max() > 0)
        if not runs:
            return (f"model {job.model_type} cannot run on any node: no execution plan fits in memory "
                    f"on up to {book.max_gpus} GPUs, even with ZeRO-Offload", "data.model.type",
                    f"a model that fits on {book.max_gpus} GPUs", job.model_type)
        if job.guaranteed and job.requested.gpus <= book.max_gpus:
            # a guarantee is the performance of what the owner asked for: it must run on that
            place = packed(job.requested.gpus, book.node_gpus)
            if book.best(kind, place, cpg).throughput <= 0:
                curve = book.gpu_curve(kind, cpg)
                least = next((g for g in range(1, len(curve)) if curve[g] > 0), None)
                need = f"; it needs at least {least} GPUs" if least else ""
                return (f"guaranteed job {job.job_id}: no execution plan of {job.model_type} fits in memory on the "
                        f"{job.requested.gpus} GPUs it asks for, so there is no performance to guarantee{need}",
                        "data.resources.gpus", f">= {least}" if least else "more GPUs", str(job.requested.gpus))
        return None

    def _support(self, job: JobState):
        """What the job's training code runs: its workload's declaration, else the deployment's default."""
        return job.support if job.support is not None else self.default_support

    def _kind(self, model: ModelType, global_batch: int, plan, support=None) -> JobKind:
        """One `JobKind` object per distinct kind, so what it caches is computed once; `support` limits it to
        the plans the job's training code runs."""
        key = (model.name, global_batch, plan, support)
        held = self._kinds.get(key)
        if held is None or held[0] is not model:
            kind = self.kind_of(model, global_batch, plan)
            if support is not None:
                kind = replace(kind, support=support)
            held = self._kinds[key] = (model, kind)
        return held[1]

    def job_in(self, job: JobState, t: float) -> JobIn | None:
        model = self.model_of(job)
        if model is None:
            return None
        job_id, alloc = job.job_id, job.decided_allocation
        held = self._shapes.get(job_id)
        if held is None or held[0] is not alloc:  # what it holds, as the engine reads it: rebuilt when a decision changes it
            held = self._shapes[job_id] = (alloc, {s.node: (s.gpus, s.cpus) for s in alloc if s.gpus > 0},
                                           {s.node: float(s.mem_gb) for s in alloc if s.gpus > 0 and s.mem_gb > 0})
        _, current, memory = held
        support = self._support(job)
        known = self._job_kinds.get(job_id)
        if known is None or known[0] is not model or known[1] is not support:
            known = self._job_kinds[job_id] = (model, support, self._kind(model, job.global_batch_size,
                                                                          job.requested_plan, support))
        requested = job.requested
        # positional, in JobIn's field order (tests/policy/test_job_in.py checks each field): once per job a round,
        # and a call with keywords costs three times as much; the fields that move on their own are set by `_forward`
        inp = JobIn(job_id, job.tenant, job.guaranteed, known[2],
                    self.order.get(job_id, len(self.order)),  # order
                    requested.gpus, requested.cpus, job.requested_plan, float(requested.mem_gb),
                    current, memory,
                    job.decided_plan if current else None,  # current_plan
                    None, job.priority, None, float(job.target_iterations), None, None, None, None)
        self._forward(((inp, job),), t)
        return inp

    def _forward(self, pairs: Iterable[tuple[JobIn, JobState]], t: float) -> None:
        """Set the fields of each job's input that change while nothing happens to it: its status, its progress (the
        iterations left, the measured speed its deadline is counted at) and those that follow the clock. Run for every
        running or guaranteed job every round (but the waiting guarantees kept apart in `_still`, whose clock fields
        alone `_listed_inputs` brings forward): what it reads of the service is looked up once."""
        progress, changed_at, ref_iter = self.progress.get, self.changed_at.get, self.ref_iter.get
        changes = self.changes.get
        ticking, inf = self.tick_period_s > 0, math.inf
        window = getattr(self.engine, "hold_backoff_s", 0.0)
        for inp, job in pairs:
            job_id = job.job_id
            # the iterations left at `t`: those measured or reported, and those run since at the measured speed
            done = job.iterations_done
            prog = progress(job_id)
            if job.status == "running":
                inp.running = True
                if prog is not None:
                    if prog.iterations > done:  # noqa: PLR1730 (a call to `max` costs more, for each job a round)
                        done = prog.iterations
                    if prog.iter_time_s and t > prog.at:
                        done += (t - prog.at) / prog.iter_time_s
            else:
                inp.running = bool(inp.current)
                if prog is not None and prog.iterations > done:
                    done = prog.iterations
            remaining = job.target_iterations - done
            inp.remaining_iters = remaining if remaining > 0 else inf
            elapsed = t - job.submitted_at
            inp.elapsed_s = elapsed if elapsed > 0.0 else 0.0
            inp.changed_s = t - changed_at(job_id, -inf) if ticking else inf
            times = changes(job_id) if window > 0 else None  # its changes within the engine's `hold_backoff_s`
            if times:
                if t - min(times) >= window:  # some left the window (they are not always in time order)
                    times[:] = [x for x in times if t - x < window]  # older ones forgotten
                inp.recent_changes = len(times)
            else:
                inp.recent_changes = 0
            inp.ref_iter_s = ref_iter(job_id, inf)

    def _inputs(self, t: float) -> list[JobIn]:
        """Every open job's `JobIn` for a round at `t`. A job that no event (but a measured iteration), decision or
        node lost touched since its input was built takes that input again, with the fields that follow the clock,
        its progress and its status brought forward (`job_in` gives the same; tests/policy/test_job_in.py checks it
        round by round). Where the engine says it reads none of those fields of a best-effort job that holds nothing
        (`waiting_clock` False), such a job's input is handed over as it is: the same object, round after round,
        which the engine may take as unchanged."""
        kept, jobs, moving = self._kept_in, [], []
        waiting_clock = getattr(self.engine, "waiting_clock", True)
        if not waiting_clock:
            return list(self._listed_inputs(t).values())
        for js in self.state.open_in(*SCHEDULED):  # the engine orders them itself
            job_id = js.job_id
            inp = kept.get(job_id)
            if inp is None:
                inp = self.job_in(js, t)
                if inp is None:
                    continue
                if job_id in self.order:
                    kept[job_id] = inp
            elif waiting_clock or inp.running or inp.guaranteed:  # else a waiting best-effort job: none of it moves
                moving.append((inp, js))
            jobs.append(inp)
        self._forward(moving, t)
        return jobs

    def _listed_inputs(self, t: float) -> dict[str, JobIn]:
        """`_inputs` for an engine that reads no clock field of a waiting best-effort job: the inputs are kept in
        `_listed` between rounds, and a round makes again only those of the jobs something happened to (`_stale`)
        and brings forward those that move with the clock (`_moving`). The same inputs as `_inputs` makes of every
        open job, in another order (the engine orders them itself)."""
        listed, moving, still, kept, states = self._listed, self._moving, self._still, self._kept_in, self.state.jobs
        resting = self._resting
        if listed is None or self.state.events != self._folded:
            listed, moving, still = self._listed, self._moving, self._still = {}, {}, {}
            self._rest_ends.clear()  # every open job is made again below, and leaves `_resting`
            self._folded = self.state.events
            stale = [js.job_id for js in self.state.open_in(*SCHEDULED)]
            self._touched = None
        else:
            stale = self._stale
            if self._touched is not None:
                self._touched |= stale
        self._stale = set()
        fresh = []
        """the jobs listed again that move with the clock: brought forward whole once, then maybe `_still`"""
        for job_id in sorted(stale) if type(stale) is set else stale:  # the same order whatever the hash seed
            js = states.get(job_id)
            scheduled = js is not None and js.status in SCHEDULED
            inp = kept.get(job_id) if scheduled else None
            if scheduled and inp is None:
                inp = self.job_in(js, t)
                if inp is None:  # no model for it (yet): asked again next round
                    self._stale.add(job_id)
                elif job_id in self.order:
                    kept[job_id] = inp
                else:
                    self._stale.add(job_id)  # not kept: made again every round
            still.pop(job_id, None)
            resting.pop(job_id, None)
            if inp is None:  # over, or no model: not handed over
                listed.pop(job_id, None)
                moving.pop(job_id, None)
                continue
            listed[job_id] = inp
            if inp.running or inp.guaranteed:
                moving[job_id] = (inp, js)
                fresh.append(job_id)
            else:
                moving.pop(job_id, None)
        if resting:
            self._rest_over(t)
        self._forward(moving.values(), t)  # those made just now a second time: `_forward` gives the same again
        if still:
            ticking, inf = self.tick_period_s > 0, math.inf
            for inp, submitted, changed, _ in still.values():  # `_forward`'s clock fields, the rest as they are
                elapsed = t - submitted
                inp.elapsed_s = elapsed if elapsed > 0.0 else 0.0  # noqa: FURB136 (as `_forward`: no call)
                inp.changed_s = t - changed if ticking else inf
        if fresh:
            changes, changed_at = self.changes, self.changed_at
            for job_id in fresh:
                inp, js = moving[job_id]
                if not inp.running and not inp.current and not changes.get(job_id):
                    del moving[job_id]
                    still[job_id] = (inp, js.submitted_at, changed_at.get(job_id, -math.inf), js)
        return listed

    def _rest_over(self, t: float) -> None:
        """Before a round at `t`: the resting jobs whose hold may end by `t` handed back to `_moving`, to be brought
        forward."""
        resting, moving, ends = self._resting, self._moving, self._rest_ends
        over = self._rested = []
        while ends and ends[0][0] <= t:
            end, job_id = heapq.heappop(ends)
            entry = resting.get(job_id)
            if entry is not None and entry[2] == end:
                del resting[job_id]
                moving[job_id] = (entry[0], entry[1])
                over.append(job_id)

    def _wake_resting(self, ids: list[str]) -> None:
        """The engine's `bring_forward`: the inputs of these resting jobs brought forward to the round's time, and
        handed back to `_moving`."""
        resting, moving, pairs = self._resting, self._moving, []
        for job_id in ids:
            entry = resting.pop(job_id, None)
            if entry is not None:
                pair = moving[job_id] = (entry[0], entry[1])
                pairs.append(pair)
        self._forward(pairs, self._round_t)

    def _rest(self, t: float) -> None:
        """After a round at `t`: the jobs the engine made dormant (`RubickEngine.fell_dormant`), and those whose rest
        ended at this round and are still dormant, rest while the clock is surely under their hold since their last
        change. Their changes within `hold_backoff_s` (`JobIn.recent_changes`) stay as many until the oldest leaves the
        window; so they rest until the earlier of their last change plus the hold of that many changes
        (`RubickEngine.rest_hold`) and the oldest's leaving, less a margin far over the rounding of what `_forward`
        would work out."""
        engine = self.engine
        fell = engine.fell_dormant
        over = self._rested
        if over:
            fell = fell + [job_id for job_id in over if engine.is_dormant(job_id)]
            self._rested = []
        if self.tick_period_s <= 0 or not fell:  # without a tick no job is held (`_forward`: `changed_s` infinite)
            return
        moving, resting, ends, stale = self._moving, self._resting, self._rest_ends, self._stale
        window = getattr(engine, "hold_backoff_s", 0.0)
        changed_at, changes, inf = self.changed_at, self.changes, math.inf
        for job_id in fell:
            pair = moving.get(job_id)
            at = changed_at.get(job_id)
            if pair is None or at is None or job_id in stale or not -inf < at < inf:
                continue
            times = changes.get(job_id) if window > 0 else None
            live = [x for x in times if t - x < window] if times else ()
            hold = engine.rest_hold(len(live))
            if not hold > 0:
                continue
            end = at + hold
            if len(live) > 1 and min(live) + window < end:  # the oldest leaves the window first
                end = min(live) + window
            if end < inf:
                end -= 1e-9 * (1.0 + abs(end) + hold + window)
            if end > t:
                del moving[job_id]
                resting[job_id] = (pair[0], pair[1], end)
                heapq.heappush(ends, (end, job_id))

    # --- a round -------------------------------------------------------------------------------
    def run_round(self, event: Event) -> list[Event]:
        self.dirty = False
        self._free = None
        if self.state.quota_shares and hasattr(self.engine, "quotas"):
            self.engine.quotas = self.state.quotas()  # a share follows the live nodes' GPUs
        self.last_round_at = event.time
        alive = self.state.alive_nodes()  # the same object until a node event changes the live nodes
        if self._caps is None or self._caps[0] is not alive:
            self._caps = (alive, [NodeCap(n.node, n.gpus, n.cpus, n.mem_gb) for n in alive])
        nodes = self._caps[1]
        listed = not getattr(self.engine, "waiting_clock", True)
        jobs = self._listed_inputs(event.time) if listed else self._inputs(event.time)
        rests = listed and hasattr(self.engine, "rest_hold")
        if rests:  # the engine asks for the inputs of the resting jobs it reads
            self._round_t = event.time
            self.engine.resting, self.engine.bring_forward = self._resting, self._wake_resting
        changed_only = getattr(self.engine, "schedule_changed", None) if nodes and not self._unasked else None
        """an engine that leaves out the outcomes that are the same objects as last round's (`RubickEngine`); not
        after a round that did not ask the engine (no live node), whose pending reasons no outcome gave"""
        self._unasked = not nodes
        if not nodes:
            outcomes = []
        elif changed_only is not None and listed:  # the inputs kept between rounds, and those made again since
            outcomes = changed_only(nodes, jobs, self._touched)
        else:
            outcomes = (changed_only or self.engine.schedule)(nodes, list(jobs.values()) if listed else jobs)
        if nodes and listed:
            self._touched = set()  # the engine has seen every input as it is now
        outcomes += self._withdrawn()
        if getattr(self.engine, "held_back", False):
            self.dirty = True  # a hold on a job just changed kept something from happening: the next tick retries
        decisions = []
        every = changed_only is None
        pending_now = self._pending_of(outcomes, list(jobs.values()) if listed and every else jobs,
                                       every) if self.reasons else {}
        last, states, new = self.last, self.state.jobs, []
        for o in outcomes:  # most repeat the last round's: only the others are sorted (a job's id is in one)
            prev = last.get(o.job_id)
            if prev is o:  # the engine gave the same outcome object again (a waiting job's)
                continue
            if prev is None:
                if not o.shares and not states[o.job_id].decided_allocation:
                    last[o.job_id] = o
                    continue
            elif (prev.shares is o.shares or prev.shares == o.shares) and (prev.plan is o.plan or prev.plan == o.plan):
                continue
            new.append((o.job_id, o, prev))
        new.sort(key=lambda x: x[0])
        holding = self._holding
        for _, o, prev in new:
            self.last[o.job_id] = o
            self._count_again(o.job_id)  # its decision below replaces what it holds, and maybe its place in `_holding`
            if o.shares:
                holding.add(o.job_id)
            else:
                holding.discard(o.job_id)
            self._kept_in.pop(o.job_id, None)
            self._stale.add(o.job_id)
            self.changed_at[o.job_id] = event.time
            if prev is not None and prev.shares:  # a change of what it runs on, not its first start
                self.changes.setdefault(o.job_id, []).append(event.time)
            if prev is not None and prev.shares:
                self._pause(o.job_id, event.time)
            decisions.append(to_decision(o))
        if rests and nodes:
            self._rest(event.time)
        out = []
        if decisions:
            self.round += 1
            payload = PlanDecided(round=self.round, policy=self.policy, decisions=tuple(decisions))
            decided = make("plan.decided", payload, time=event.time, id=f"{self.policy}-round-{self.round}",
                           source=self.name)
            self._apply(decided)
            out.append(decided)
        if not self.reasons:
            return out
        pending, open_jobs = self.pending, self.state.open_jobs
        cleared = []
        if every:
            left = [j for j in pending if j not in pending_now]
        else:  # a job whose outcome was left out has its reason of last round; the others are those given now
            left = {o.job_id for o in outcomes if o.job_id in pending and o.job_id not in pending_now}
            left |= pending.keys() - (jobs.keys() if listed else {j.job_id for j in jobs})  # over, or no model
            for job_id in left:
                self._made.pop(job_id, None)
        for job_id in left:
            if job_id in open_jobs:
                cleared.append(job_id)
            else:
                del pending[job_id]  # over, suspended or cancelled: it leaves the set without a word
        changed = {j: p for j, p in pending_now.items() if pending.get(j) is not p and pending.get(j) != p}
        cleared.sort()
        return out + self._publish_pending(event, changed, cleared)

    def _pending_of(self, outcomes: list[Outcome], jobs: list[JobIn], every: bool = True) -> dict[str, Pending]:
        """Each waiting or short job's reason after a round (the engine's, or `no-gpus` for a job it did
        not place and gave no reason for). `every`: the outcomes are every job's; else only those an engine's
        `schedule_changed` gave, and the reasons are theirs (the others keep theirs, and their `_made`)."""
        out = {}
        made = self._made
        if every:
            self._made = {}
        for o in outcomes:
            if o.pending is not None:
                held = made.get(o.job_id)
                if held is None or held[2] is not o:  # the same outcome object as last round: the same reason
                    reason, needs, detail = o.pending
                    raw = (reason, sum(g for g, _, _ in o.shares.values()) if o.shares else 0, needs, detail)
                    if held is None or held[0] != raw:  # the same reason as last round: the same Pending object
                        held = (raw, Pending(job_id=o.job_id, reason=reason, gpus=raw[1], needs_gpus=needs,
                                             detail=detail), o)
                    else:
                        held = (held[0], held[1], o)
                self._made[o.job_id] = held
                out[o.job_id] = held[1]
            else:
                if not every:
                    self._made.pop(o.job_id, None)
                if not o.shares and o.reason not in WITHDRAWN:
                    out[o.job_id] = Pending(job_id=o.job_id, reason="no-fit" if "fits" in o.detail.get("why", "")
                                            else "no-gpus")
        if every:
            seen = {o.job_id for o in outcomes}
            for j in jobs:  # no node to run on: the engine was not asked
                if j.job_id not in seen:
                    out[j.job_id] = Pending(job_id=j.job_id, reason="no-gpus")
        return out

    def _publish_pending(self, event: Event, changed: dict[str, Pending], cleared) -> list[Event]:
        if not changed and not cleared:
            return []
        for j in cleared:
            self.pending.pop(j, None)
        self.pending.update(changed)
        self.pending_seq += 1
        payload = PlanPending(round=self.round, policy=self.policy,
                              pending=tuple(changed[j] for j in sorted(changed)), cleared=tuple(cleared))
        ev = make("plan.pending", payload, time=event.time, id=f"{self.policy}-pending-{self.pending_seq}",
                  source=self.name)
        self._apply(ev)
        return [ev]

    def _withdrawn(self) -> list[Outcome]:
        """Jobs cancelled or suspended by their owner that still hold resources: an empty allocation each
        (the agents checkpoint and stop them)."""
        states, last = self.state.jobs, self.last
        out = []
        for job_id in sorted(j for j in self._stopped if (job := states.get(j)) is not None
                             and job.status in WITHDRAWN and j in last and last[j].shares):
            out.append(Outcome(job_id, {}, None, 0.0, WITHDRAWN[states[job_id].status], {}))
        self._stopped = {o.job_id for o in out}  # the others hold nothing, or were resumed: a new request adds them
        return out

    def explain(self, job_id: str, t: float | None = None) -> dict:
        from .explain import explain_job
        return explain_job(self, job_id, self.state.time if t is None else t)


def _as_asked(job: JobState, m, node_gpus: int) -> bool:
    """Whether a measurement is of the job's requested plan (GA steps aside: the policy fills them
    in) on its requested GPUs packed on whole nodes."""
    if m.plan is None or tuple(sorted(m.gpus_per_node, reverse=True)) != packed(job.requested.gpus, node_gpus):
        return False
    want = job.requested_plan
    return want is not None and replace(m.plan, ga_steps=want.ga_steps) == want


def to_decision(o: Outcome) -> Decision:
    # fields by position, in the order the classes declare them (node, gpus, cpus, mem_gb; job_id, allocation, plan,
    # predicted_throughput, reason, detail): a frozen dataclass called by keyword costs about twice as much
    alloc = tuple(NodeShare(n, g, c, float(m)) for n, (g, c, m) in sorted(o.shares.items()))
    return Decision(o.job_id, alloc, o.plan if alloc else None, round(float(o.throughput), 6) if alloc else 0.0,
                    o.reason[:64], {k: str(v)[:200] for k, v in sorted(o.detail.items())})


def known_models(models: Mapping[str, ModelType]) -> dict[str, ModelType]:
    return {k: models[k] for k in sorted(models)}
