"""The network scheduler's bus core: `plan.decided` (and the jobs' ends) in, `network.decided` out.

It keeps, for every job the policy has placed, its plan and allocation; after each change it builds
one iteration of every job whose flows leave a node (`pattern.iteration_pattern`, compute times from
the performance model with the parameters `model.updated` last gave), ranks the jobs and cuts the
ranks into traffic classes (`decide.classify`), and publishes `network.decided` with the jobs whose
class or rank changed and those that no longer send flows between nodes. Nothing is published when
nothing changed.

The network is every registered node's NIC (`nic_bps` each: the environment's inter-node bandwidth,
the one the performance model uses), optionally in racks behind an oversubscribed core.

Pure core (DESIGN.md): time comes from the events, iteration is in stable order, the event ids of
what it publishes are derived from its decision number, so replaying the same inputs reproduces every
`network.decided` byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from controlplane.events import Event, make
from controlplane.events.payloads import NETWORK_MODES, JobNetwork, NetworkDecided
from modeler.env import Environment
from modeler.perf_model import PerfParams
from modeler.spec import ModelType

from .decide import classify
from .fluid import Pattern
from .pattern import iteration_pattern, timing
from .topology import Network, NetworkError

NAME = "network"


@dataclass
class _Placed:
    model: str
    batch: int
    plan: object
    allocation: tuple


@dataclass
class NetworkCore:
    mode: str
    models: Mapping[str, ModelType]
    env: Environment
    params: dict[str, PerfParams]
    classes: int = 4
    rack_size: int = 0
    oversubscription: float = 1.0
    name: str = NAME
    subjects: tuple[str, ...] = ("job.submitted", "job.completed", "job.completed.>", "job.failed", "job.failed.>",
                                 "job.preempted", "job.preempted.>", "node.registered", "node.registered.>",
                                 "node.lost", "plan.decided", "plan.decided.>", "model.updated")
    jobs: dict[str, tuple[str, int]] = field(default_factory=dict)
    placed: dict[str, _Placed] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    published: dict[str, tuple[int, int]] = field(default_factory=dict)
    """job -> (class, rank) last published"""
    round: int = 0
    errors: dict[str, str] = field(default_factory=dict)
    """job -> why its flows could not be built (it is left out of the decision)"""
    _timing: dict[tuple, object] = field(default_factory=dict)
    _patterns: dict[tuple, Pattern | None] = field(default_factory=dict)
    _keys: dict[tuple, tuple] = field(default_factory=dict)
    """classify's per-job keys, by job and placement (`decide.classify` `cache`); cleared with the patterns"""

    def __post_init__(self) -> None:
        if self.mode not in NETWORK_MODES:
            raise ValueError(f"unknown network mode {self.mode!r}; expected one of {', '.join(NETWORK_MODES)}")
        if not 1 <= self.classes <= 8:
            raise ValueError("classes must be 1 to 8")

    def handle(self, event: Event) -> list[Event]:
        base, x = event.base, event.payload
        if base == "job.submitted":
            self.jobs.setdefault(x.job_id, (x.model.type, x.global_batch_size))
            return []
        if base == "node.registered":
            if x.node not in self.nodes:
                self.nodes.append(x.node)
                self._forget()  # the network changed: the keys are worked out again
            return []
        if base == "node.lost":
            return []  # the policy's decisions that follow take its jobs away
        if base == "model.updated":
            try:
                self.params[x.model_type] = PerfParams.from_dict(dict(x.params))
            except ValueError:
                return []
            self._forget()
            return self._decide(event) if any(p.model == x.model_type for p in self.placed.values()) else []
        if base == "plan.decided":
            changed = False
            for d in x.decisions:
                known = self.jobs.get(d.job_id)
                if not d.allocation or d.plan is None or known is None:
                    changed |= self.placed.pop(d.job_id, None) is not None
                else:
                    self.placed[d.job_id] = _Placed(known[0], known[1], d.plan, tuple(d.allocation))
                    changed = True
            return self._decide(event) if changed else []
        if base in ("job.completed", "job.failed", "job.preempted"):
            if self.placed.pop(x.job_id, None) is not None:
                return self._decide(event)
        return []

    def network(self) -> Network:
        names = sorted(set(self.nodes) | {s.node for p in self.placed.values() for s in p.allocation})
        return Network.hose(names, self.env.b_inter, rack_size=self.rack_size,
                            oversubscription=self.oversubscription)

    def _forget(self) -> None:
        self._timing.clear()
        self._patterns.clear()
        self._keys.clear()

    def patterns(self) -> list[Pattern]:
        out = []
        for job_id in sorted(self.placed):
            p = self.placed[job_id]
            model, params = self.models.get(p.model), self.params.get(p.model)
            if model is None or params is None:
                self.errors[job_id] = f"no spec or parameters for model type {p.model}"
                continue
            place = [(s.node, s.gpus) for s in p.allocation if s.gpus > 0]
            key = (p.model, p.plan, tuple(g for _, g in place), p.batch)
            whole = (job_id, *key, tuple(place))
            try:
                if whole not in self._patterns:
                    tm = self._timing.get(key)
                    if tm is None:
                        tm = self._timing[key] = timing(model, self.env, params, p.plan, key[2], p.batch)
                    self._patterns[whole] = iteration_pattern(job_id, p.plan, place, model, tm, p.batch)
                pat = self._patterns[whole]
            except (NetworkError, ValueError) as exc:
                self.errors[job_id] = str(exc)
                continue
            self.errors.pop(job_id, None)
            if pat is not None:
                out.append(pat)
        if len(self._patterns) > 4 * max(len(self.placed), 256):
            self._patterns.clear()
            self._keys.clear()
        return out

    def _decide(self, event: Event) -> list[Event]:
        rows = classify(self.mode, self.network(), self.patterns(), self.classes, cache=self._keys) if self.placed else []
        now = {r.job: r for r in rows}
        decisions = tuple(JobNetwork(r.job, r.traffic_class, r.rank, r.bytes_per_iteration, r.tardiness_s)
                          for r in rows if self.published.get(r.job) != (r.traffic_class, r.rank))
        cleared = tuple(sorted(j for j in self.published if j not in now))
        if not decisions and not cleared:
            return []
        self.published = {r.job: (r.traffic_class, r.rank) for r in rows}
        self.round += 1
        payload = NetworkDecided(mode=self.mode, round=self.round, classes=self.classes, decisions=decisions,
                                 cleared=cleared)
        return [make("network.decided", payload, time=event.time, id=f"network-{self.round}", source=self.name)]
