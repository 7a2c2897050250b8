"""What the policy believes about iteration times: an `Oracle`.

The policy asks one question, many times per round: "for this model at this global batch, on this
placement with this many CPU threads per GPU, how long does one iteration of each of these plans
take?" An oracle answers seconds per iteration (`inf` where the plan does not fit or is unknown)
and the plans with their GA steps filled in (the fewest that fit in GPU memory).

- `ModelOracle`: the fitted performance model and memory estimator of `modeler/` (live default).
  `update(ModelUpdated)` takes new parameters and bumps the type's version, which invalidates the
  policy's cached curves. `observe(...)` compares the first measured iteration of each
  configuration a job ran with its prediction and keeps, per type, the most a prediction has
  overshot the measured speed (`overshoot`): the policy's guarantee margin for that type. The
  predictions themselves are left as they are (docs/policy.md says what patching them cost).
  `bounds` holds each type's error bounds from its fit, per plan family (`modeler.uncertainty`), which
  replace the fixed margin where they are known.
- `TableOracle`: measured iteration times (`modeler.table.MeasuredTable`); a configuration never
  measured is unknown (`inf`). The paper's checks (Fig. 7, Fig. 8) use it.

Pure code: no I/O after construction.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Mapping, Protocol, Sequence

import numpy as np

from controlplane.events import ModelUpdated, Plan
from modeler.configs import Config, ConfigBatch, ConfigError, _stack, layout
from modeler.env import Environment
from modeler.memory import host_bytes, resolve_feasible
from modeler.perf_model import PerfParams, t_iter
from modeler.uncertainty import clean_bounds
from modeler.spec import ModelType
from modeler.table import MeasuredTable

from .plans import canonical


Item = tuple[tuple[int, ...], int, Plan]
"""(placement, CPU threads per GPU, plan): one configuration to evaluate."""


class Oracle(Protocol):
    def version(self, model_type: str) -> int: ...
    # optional: `refits()`, a value equal to an earlier one only while no type's version changed (`ModelOracle`)

    def evaluate(self, model: ModelType, global_batch: int, placement: tuple[int, ...], cpus_per_gpu: int,
                 plans: Sequence[Plan]) -> tuple[np.ndarray, tuple[Plan, ...]]: ...

    def evaluate_many(self, model: ModelType, global_batch: int,
                      items: Sequence[Item]) -> tuple[np.ndarray, tuple[Plan, ...]]: ...

    def host_mem_gb(self, model: ModelType, global_batch: int, placement: tuple[int, ...],
                    plan: Plan) -> float: ...


def _batch(model: ModelType, global_batch: int, items: Sequence[Item], ga_auto: bool) -> ConfigBatch:
    """The configurations as arrays. Enumerated plans are valid by construction, so only plans from
    elsewhere (a job's request) go through the full check."""
    rows = _rows(model, global_batch, items, ga_auto)
    if rows is None:
        return ConfigBatch.from_configs(
            [Config(plan=q, gpus_per_node=pl, cpus_per_gpu=c, global_batch_size=global_batch, ga_auto=ga_auto)
             for pl, c, q in items], allow_tp_across_nodes=model.allow_tp_across_nodes)
    return _stack(rows)


def _rows(model: ModelType, global_batch: int, items: Sequence[Item], ga_auto: bool) -> list[tuple] | None:
    """The rows of `_batch` (`ConfigBatch`'s fields in order), made without the full check; None where an item is not
    a plan that plainly fills its placement and splits the batch (a plan from elsewhere: the full check says why)."""
    rows = []
    for place, cpg, p in items:
        if not isinstance(p, Plan) or p.dp * p.tp * p.pp != sum(place) or global_batch % (p.dp * p.micro_batches):
            return None
        lay = layout(place, p.dp, p.tp, p.pp)
        if lay.tp_inter and not model.allow_tp_across_nodes:
            raise ConfigError(f"tp={p.tp} does not fit inside the nodes of placement {place}")
        rows.append((p.dp, p.tp, p.pp, p.zero_stage, bool(p.offload), bool(p.gc), 0 if ga_auto else p.ga_steps,
                     p.micro_batches, global_batch, float(cpg), sum(place), lay.nodes, lay.min_node_gpus,
                     lay.dp_inter, lay.tp_inter, lay.pp_inter))
    return rows


def _with_ga(plans: Sequence[Plan], ga: np.ndarray) -> tuple[Plan, ...]:
    out = []
    for p, a in zip(plans, ga.tolist()):
        if p.ga_steps != a:
            key = (p, a)
            q = _GA_PLANS.get(key)
            if q is None:  # the same plans come back resolved the same way (a placement's plans are kept)
                q = replace(p, ga_steps=a)
                if len(_GA_PLANS) >= 1 << 14:
                    _GA_PLANS.clear()
                _GA_PLANS[key] = q
            p = q
        out.append(p)
    return tuple(out)


_ANSWERS_KEPT = 1 << 13
"""answers `ModelOracle` keeps per model type for `observe`: past that, they are dropped and kept afresh"""
_ROWS_KEPT = 1 << 15
"""rows whose answers `ModelOracle` keeps per model type (`_answers_of`; a cluster's first round at 8,192 GPUs asks
about 6,300 over its seven types): past that, they are dropped and kept afresh"""
_RECENT_CALLS = 512
"""`evaluate_many` calls `ModelOracle` holds until `observe` asks (the older ones are dropped unread)"""

_GA_PLANS: dict[tuple[Plan, int], Plan] = {}
"""(plan, GA steps) -> the plan with those steps (`_with_ga`): `dataclasses.replace` costs more than the lookup"""


@dataclass
class _MemoryMixin:
    env: Environment

    def host_mem_gb(self, model: ModelType, global_batch: int, placement: tuple[int, ...], plan: Plan) -> float:
        """Host memory the plan needs for model states (all nodes together), GB."""
        batch = _batch(model, global_batch, [(placement, self.env.default_cpus_per_gpu, plan)], False)
        return float(host_bytes(model, batch)[0]) / 1e9

    def resolved(self, model: ModelType, global_batch: int, items: Sequence[Item]) -> tuple[ConfigBatch, np.ndarray]:
        return resolve_feasible(model, self.env, _batch(model, global_batch, items, True))

    def evaluate(self, model: ModelType, global_batch: int, placement: tuple[int, ...], cpus_per_gpu: int,
                 plans: Sequence[Plan]) -> tuple[np.ndarray, tuple[Plan, ...]]:
        return self.evaluate_many(model, global_batch, [(placement, cpus_per_gpu, p) for p in plans])


@dataclass
class ModelOracle(_MemoryMixin):
    """Predictions of the fitted performance model; default parameters for a type never fitted."""

    params: dict[str, PerfParams] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    overshoot: dict[str, float] = field(default_factory=dict)
    """model type -> the most a configuration's first measured iteration ran longer than predicted
    (0.5 = 50% longer), under whichever parameters were current: how far the type's predictions of
    speed can be trusted (the policy's guarantee margin). It only grows."""
    measured: set = field(default_factory=set)
    """configurations compared so far: (type, global batch, placement, CPUs per GPU or None, plan)."""
    bounds: dict[str, dict[str, float]] = field(default_factory=dict)
    """model type -> the fitted parameters' error bounds per plan family and overall (`modeler.uncertainty`;
    `model.updated`'s `error_bounds`): how much a prediction may be too fast. The policy's guarantee
    margins for the type where there are some."""

    _answers: dict[str, tuple[int, dict]] = field(default_factory=dict, repr=False, compare=False)
    """model type -> (its version, {(global batch, placement, CPUs per GPU (0 without offload), plan): (seconds
    per iteration, GA steps)}): `evaluate_many`'s answers kept for `observe` (`_kept_answer`)"""
    _rows_answered: dict[str, tuple[int, dict, ModelType]] = field(default_factory=dict, repr=False, compare=False)
    """model type -> (its version, {a row of `_rows`: (seconds per iteration, GA steps)}, the model they are of):
    `_answers_of`"""
    _recent: deque = field(default_factory=lambda: deque(maxlen=_RECENT_CALLS), repr=False, compare=False)
    """the last `evaluate_many` calls (type, its version then, global batch, items, times, GA steps), not read into
    `_answers` yet"""

    cpus_offload_only = True
    """The model's CPU count enters only ZeRO-Offload's times (`modeler.perf_model`): a plan without offload takes
    the same at every count (`PlanBook.fill` asks once for it). A table's rows may say otherwise: `TableOracle`
    has no such promise."""

    def version(self, model_type: str) -> int:
        return self.versions.get(model_type, 0)

    def refits(self) -> tuple:
        """Every type's version (`version`) as one value: equal to an earlier one only while no type's changed."""
        return tuple(self.versions.items())

    def observe(self, model: ModelType, global_batch: int, placement: tuple[int, ...], cpus_per_gpu: int | None,
                plan: Plan, iter_time_s: float) -> bool:
        """Compare the first measured iteration of a configuration with its prediction; True when
        it ran slower than any configuration of its type before (`overshoot` grew)."""
        if not (iter_time_s > 0 and math.isfinite(iter_time_s)) or (plan.offload and not cpus_per_gpu):
            return False  # offload depends on the CPUs: without their count the prediction is unknown
        key = (model.name, global_batch, canonical(placement), cpus_per_gpu if plan.offload else None, plan)
        if key in self.measured:
            return False
        self.measured.add(key)
        answer = self._kept_answer(model, global_batch, key[2], cpus_per_gpu or 1, plan)
        if answer is None:
            try:
                answer = self.evaluate_many(model, global_batch, [(key[2], cpus_per_gpu or 1, plan)])
            except ConfigError:
                return False
        times, plans = answer
        predicted = float(times[0])
        if plans[0] != plan or not (predicted > 0 and math.isfinite(predicted)):
            return False
        miss = iter_time_s / predicted - 1.0
        if miss <= self.overshoot.get(model.name, 0.0):
            return False
        self.overshoot[model.name] = miss
        return True

    def update(self, upd: ModelUpdated) -> None:
        self.params[upd.model_type] = PerfParams.from_dict(dict(upd.params))
        self.versions[upd.model_type] = self.versions.get(upd.model_type, 0) + 1
        bounds = clean_bounds(upd.error_bounds)
        if bounds is not None:
            self.bounds[upd.model_type] = bounds

    def evaluate_many(self, model: ModelType, global_batch: int,
                      items: Sequence[Item]) -> tuple[np.ndarray, tuple[Plan, ...]]:
        if not items:
            return np.zeros(0), ()
        version = self.versions.get(model.name, 0)
        rows = _rows(model, global_batch, items, True)
        if rows is None:  # a plan from elsewhere: the full check, which says what is wrong with it
            batch, ok = self.resolved(model, global_batch, items)
            times, ga = self._times(model, batch, ok), batch.ga_steps
        else:
            times, ga = self._answers_of(model, version, rows)
        self._recent.append((model.name, version, global_batch, tuple(items), times, ga))
        return times, _with_ga([p for _, _, p in items], ga)

    def time_floor(self, model: ModelType, global_batch: int, items: Sequence[tuple[int, int, Plan]],
                   node_gpus: int) -> np.ndarray | None:
        """For each (GPUs, CPUs per GPU, plan): seconds per iteration that no placement of that many GPUs, on nodes of
        at most `node_gpus` each, beats at that many CPUs or fewer (`inf` where it fits on none); None where the
        model's parameters give no such floor. A policy asks it to know that no allocation it could gather pays for
        a change (`PlanBook.ceiling`).

        A placement enters a time only through which groups cross nodes and the fewest GPUs of a node (the inter-node
        bandwidth), and its feasibility only through the host memory of its nodes (`modeler.perf_model`,
        `modeler.memory`). Each plan is worked out on the most favourable values those can take: no group crossing
        where its GPUs fit on one node; where they do not, one group crossing (rank 0 and the last rank are on
        different nodes, so the TP, DP or PP group joining them crosses), the others not, on the most NICs a node
        reaches; as many nodes as GPUs (the most host memory a plan's GPUs can have, the least it needs per node).
        Each value only slows a plan down or shrinks its memory as it moves away from there, while the inter-node
        link is no faster than the intra-node one and the overlap exponents are positive (else None); and CPUs only
        speed up ZeRO-Offload's step."""
        params = self.params.get(model.name, PerfParams())
        env = self.env
        most = max(node_gpus, env.gpus_per_node)  # the smallest node's GPUs at their most: the most NICs it reaches
        rails = env.b_inter_rails(most)
        if not (params.k_sync > 0 and params.k_off > 0 and params.k_swap > 0) or float(rails) > env.b_intra:
            return None
        if not items:
            return np.zeros(0)
        rows, owner = [], []  # rows as `_rows` makes them (`ConfigBatch`'s fields in order), GA steps left open
        for i, (gpus, cpg, p) in enumerate(items):
            if p.dp * p.tp * p.pp != gpus or global_batch % (p.dp * p.micro_batches):
                raise ValueError(f"plan {p} does not fill {gpus} GPUs or split a batch of {global_batch}")
            head = (p.dp, p.tp, p.pp, p.zero_stage, bool(p.offload), bool(p.gc), 0, p.micro_batches, global_batch,
                    float(cpg), gpus, gpus)
            if gpus <= node_gpus:
                crossings = [(False, False, False)]
            else:
                crossings = [c for c, degree in (((True, False, False), p.dp), ((False, True, False), p.tp),
                                                 ((False, False, True), p.pp))
                             if degree > 1 and (model.allow_tp_across_nodes or not c[1])]
            for dp_inter, tp_inter, pp_inter in crossings:
                rows.append(head + (most, dp_inter, tp_inter, pp_inter))
                owner.append(i)
        floor = np.full(len(items), np.inf)
        if rows:
            batch, ok = resolve_feasible(model, env, _stack(rows))
            np.minimum.at(floor, np.array(owner), self._times(model, batch, ok))
        return floor

    def _times(self, model: ModelType, batch: ConfigBatch, ok: np.ndarray) -> np.ndarray:
        """Seconds per iteration of a resolved batch under the type's parameters; `inf` where `ok` is false."""
        return np.where(ok, t_iter(model, self.env, self.params.get(model.name, PerfParams()), batch), np.inf)

    def _answers_of(self, model: ModelType, version: int, rows: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
        """(seconds per iteration, GA steps) of each row, those of rows answered before under the type's version
        read back (`_rows_answered`), the others worked out in one batch. A row is all a configuration's answer
        depends on (its placement enters only through the GPUs, nodes, smallest node and which groups cross), and
        each row is worked out on its own, so an answer read back is the very one a batch would give: many
        placements have the same rows (the trims a search asks about, thousands of them in a cluster's first round)."""
        held = self._rows_answered.get(model.name)
        if (held is None or held[0] != version or (held[2] is not model and held[2] != model)
                or len(held[1]) >= _ROWS_KEPT):
            held = self._rows_answered[model.name] = (version, {}, model)
        known = held[1]
        answers = list(map(known.get, rows))  # most calls ask only rows answered before: each is hashed once
        if None in answers:
            new = list(dict.fromkeys(r for r, a in zip(rows, answers) if a is None))  # each once, in their first order
            batch, ok = resolve_feasible(model, self.env, _stack(new))
            times = self._times(model, batch, ok)
            for row, t, a in zip(new, times.tolist(), batch.ga_steps.tolist()):
                known[row] = (t, a)
            answers = [known[r] for r in rows]
        return (np.array([t for t, _ in answers], dtype=np.float64),
                np.array([a for _, a in answers], dtype=np.int64))

    def _kept_answer(self, model: ModelType, global_batch: int, place: tuple[int, ...], cpg: int,
                     plan: Plan) -> tuple[np.ndarray, tuple[Plan, ...]] | None:
        """`evaluate_many` of the one item, where one of the last calls (`_recent`) answered it under the type's
        version (None where none did). Its answer is the same: the GA steps are the modeler's to choose (the plan's
        own are not read), each item's time is worked out on its own, and without ZeRO-Offload the CPUs enter no
        time (`cpus_offload_only`). The calls are read into `_answers` here, when asked, not as they are made: a
        cluster's first round makes hundreds and observes nothing."""
        version = self.versions.get(model.name, 0)
        while self._recent:
            name, made, gbs, items, times, ga = self._recent.popleft()
            if made != self.versions.get(name, 0):
                continue  # answered under parameters refitted since
            held = self._answers.get(name)
            if held is None or held[0] != made or len(held[1]) >= _ANSWERS_KEPT:
                held = self._answers[name] = (made, {})
            kept = held[1]
            for (p_place, p_cpg, p), t, a in zip(items, times.tolist(), ga.tolist()):
                if p.ga_steps == 1:  # every plan the policy enumerates
                    kept[(gbs, p_place, p_cpg if p.offload else 0, p)] = (t, a)
        held = self._answers.get(model.name)
        if held is None or held[0] != version:
            return None
        hit = held[1].get((global_batch, place, cpg if plan.offload else 0,
                           plan if plan.ga_steps == 1 else replace(plan, ga_steps=1)))
        if hit is None:
            return None
        t, a = hit
        return np.array([t]), (plan if plan.ga_steps == a else replace(plan, ga_steps=a),)


@dataclass
class TableOracle(_MemoryMixin):
    """Measured iteration times; unknown where the table has no row. `aliases` maps a job's model
    type to the table's model key (e.g. a spec named `t5-3b` measured as `t5_3B`)."""

    table: MeasuredTable = field(default_factory=MeasuredTable)
    aliases: Mapping[str, str] = field(default_factory=dict)

    def version(self, model_type: str) -> int:
        return 0

    def refits(self) -> tuple:
        """As `ModelOracle.refits`: a table's times are never refitted."""
        return ()

    def evaluate_many(self, model: ModelType, global_batch: int,
                      items: Sequence[Item]) -> tuple[np.ndarray, tuple[Plan, ...]]:
        if not items:
            return np.zeros(0), ()
        key = self.aliases.get(model.name, model.name)
        batch, _ = self.resolved(model, global_batch, items)
        times = np.empty(len(items))
        for i, (place, cpg, p) in enumerate(items):
            t = self.table.iter_time(key, p, place, cpg)
            times[i] = math.inf if t is None else t
        return times, _with_ga([p for _, _, p in items], batch.ga_steps)


def from_modeler(modeler) -> tuple["ModelOracle", dict[str, ModelType]]:
    """An oracle and the model types seeded from a `modeler.service.ModelerCore` (its fitted
    parameters at start); later refits arrive as `model.updated` events."""
    params = {k: st.params for k, st in sorted(modeler.types.items()) if st.params is not None}
    models = {k: st.model for k, st in sorted(modeler.types.items())}
    bounds = {k: dict(st.bounds) for k, st in sorted(modeler.types.items()) if st.bounds}
    return ModelOracle(env=modeler.env, params=params, bounds=bounds), models
