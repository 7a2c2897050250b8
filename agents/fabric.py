"""The simulated cluster's network: how contention between jobs' flows stretches their iterations.

Ground truth for the trace simulator under `--network` (never for the policy): the jobs running (or
restarting) whose iterations send flows between nodes are grouped into the sets that share a link
(union of jobs crossing a common NIC or rack uplink); each set with more than one job is run in the
flow-level simulator (`policy.network.fluid`) for `iterations` iterations, the fabric serving the
traffic classes of the latest `network.decided` in strict priority and sharing fairly inside a class
(what switches with priority queues do). A job's slowdown is its mean iteration time there over its
mean iteration time alone on the network (never below 1); its measured iteration time (the table's)
is multiplied by it. A job whose flows stay inside a node, or that shares no link, runs at its
measured speed. Results are cached by the set's jobs, placements and classes.
Pure code: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from controlplane.events import NodeShare, Plan
from modeler.env import Environment
from modeler.perf_model import PerfParams
from modeler.spec import ModelType
from policy.network.fluid import Pattern, simulate
from policy.network.pattern import iteration_pattern, timing
from policy.network.topology import Network, NetworkError


@dataclass(frozen=True)
class Running:
    model: str
    plan: Plan
    allocation: tuple[NodeShare, ...]
    batch: int


@dataclass
class Fabric:
    models: Mapping[str, ModelType]
    env: Environment
    params: Mapping[str, PerfParams]
    nodes: tuple[str, ...]
    rack_size: int = 0
    oversubscription: float = 1.0
    iterations: int = 3
    network: Network = field(init=False)
    simulations: int = 0
    """fluid simulations run (cache misses)"""
    _patterns: dict[tuple, Pattern | None] = field(default_factory=dict)
    _alone: dict[tuple, float] = field(default_factory=dict)
    _sets: dict[tuple, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.network = Network.hose(list(self.nodes), self.env.b_inter, rack_size=self.rack_size,
                                    oversubscription=self.oversubscription)

    def pattern(self, job: str, r: Running, klass: int) -> Pattern | None:
        place = tuple((s.node, s.gpus) for s in r.allocation if s.gpus > 0)
        key = (job, r.model, r.plan, place, r.batch, klass)
        if key not in self._patterns:
            model, params = self.models.get(r.model), self.params.get(r.model)
            pat = None
            if model is not None and params is not None:
                try:
                    tm = timing(model, self.env, params, r.plan, tuple(g for _, g in place), r.batch)
                    pat = iteration_pattern(job, r.plan, place, model, tm, r.batch, klass=klass)
                except (NetworkError, ValueError):
                    pat = None
            self._patterns[key] = pat
        return self._patterns[key]

    def slowdowns(self, running: Mapping[str, Running], classes: Mapping[str, int]) -> dict[str, float]:
        """job -> factor >= 1 on its iteration time, for every job in `running` that shares a link."""
        pats = {}
        for job in sorted(running):
            pat = self.pattern(job, running[job], classes.get(job, 0))
            if pat is not None:
                pats[job] = pat
        out: dict[str, float] = {}
        for group in self._sharing(pats):
            if len(group) < 2:
                continue
            key = tuple((j, running[j].model, running[j].plan, running[j].allocation, running[j].batch,
                         classes.get(j, 0)) for j in group)
            got = self._sets.get(key)
            if got is None:
                got = self._run(group, pats)
                if len(self._sets) > 50_000:
                    self._sets.clear()
                self._sets[key] = got
            out.update(got)
        return out

    def _sharing(self, pats: Mapping[str, Pattern]) -> list[list[str]]:
        parent = {j: j for j in pats}

        def root(j: str) -> str:
            while parent[j] != j:
                parent[j] = parent[parent[j]]
                j = parent[j]
            return j

        owner: dict[int, str] = {}
        for job, pat in pats.items():
            for t in pat.flows:
                for link in self.network.path(t.src, t.dst):
                    other = owner.setdefault(link, job)
                    if other != job:
                        a, b = root(job), root(other)
                        if a != b:
                            parent[max(a, b)] = min(a, b)
        groups: dict[str, list[str]] = {}
        for job in sorted(pats):
            groups.setdefault(root(job), []).append(job)
        return [groups[k] for k in sorted(groups)]

    def _alone_s(self, pat: Pattern) -> float:
        key = (pat.tasks,)
        if key not in self._alone:
            res = simulate(self.network, [pat], "classes", iterations=1)
            self._alone[key] = res.mean_iteration(pat.job)
            self.simulations += 1
        return self._alone[key]

    def _run(self, group: list[str], pats: Mapping[str, Pattern]) -> dict[str, float]:
        res = simulate(self.network, [pats[j] for j in group], "classes", iterations=self.iterations)
        self.simulations += 1
        out = {}
        for j in group:
            alone = self._alone_s(pats[j])
            shared = res.mean_iteration(j)
            out[j] = max(1.0, shared / alone) if alone > 0 else 1.0
        return out
