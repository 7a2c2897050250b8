"""The modeler service core: measured points in, refitted parameters out.

A pure core for `controlplane.service.ServiceShell` (deterministic, no I/O, no wall clock: time only
from `event.time`; output ids derived from inputs). It consumes

- `job.submitted`: remembers each job's global batch, and learns a new model type from a job that
  carries its full spec (with a profiled forward time);
- `metrics.iteration`: one measured iteration. An impossible one (unknown model type, a plan that
  does not match the placement or the batch, TP across nodes where the spec forbids it, a
  breakdown part longer than the iteration) is answered with `metrics.rejected` and not used.
  Otherwise the point is kept (the latest `per_config` per configuration, at most `max_configs`
  configurations per type), its relative error against the current parameters enters a rolling
  window, and the type is refitted when the window's mean error passes `threshold` (default 10%)
  or when a type without parameters has enough points for a first fit;
- `model.updated`: parameters published by anyone (this core included) with a higher version than
  the one held are adopted, so a restarted core replaying the log ends where it was.

A refit publishes `model.updated` with the parameters, version + 1, the points used, the RMSLE and
the reason, when it pays: its mean relative error on the kept points must be at least `min_gain`
(default 10%) lower than the current parameters'. Otherwise the current parameters stay and the
window starts again: an error the model's form cannot follow (a placement it has no term for) would
else be refitted every few measurements, and every `model.updated` makes the policy recompute the
type's curves. With `refit_backoff` n > 0, a type whose last k refits in a row fitted and published nothing
waits for `min_window` * 2^min(k, n) measurements after the window starts again before the next (each such
refit is a fit that pays nothing); a published or adopted `model.updated` ends the run of unpaid ones. A refit
that finds too few points to fit leaves the window as it is and is not counted. A refit of the same points
(configurations and times) from the same parameters as the last refit that published nothing is answered as
that one was, without fitting again: a job measured again and again on the same configurations keeps its last
few points the same. Re-handling an event id already seen for a type changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from controlplane.events import Event, JobSubmitted, MetricsIteration, ModelUpdated, Rejected, make
from controlplane.events.payloads import MAX_REFIT_BACKOFF

from .configs import Config, ConfigBatch, ConfigError, config_row
from .env import Environment
from .fit import FitError, Measurements, fit
from .memory import resolve_ga
from .perf_model import OFFLOAD_PARAMS, PerfParams, t_iter
from .spec import ModelType
from .uncertainty import Uncertainty, clean_bounds, estimate, out_of_fold

NAME = "modeler"
REFIT_FOLDS = 5
"""Folds of the out-of-fold error an online refit publishes as its bound (`modeler.uncertainty`)."""


@dataclass
class _Point:
    seq: int
    event_id: str
    config: Config
    iter_time_s: float
    fwd_s: float
    bwd_s: float
    opt_s: float
    row: tuple
    """the configuration's entries of a `ConfigBatch` (`config_row`), made once when the point is taken"""


@dataclass
class _TypeState:
    model: ModelType
    params: PerfParams | None = None
    version: int = 0
    points: dict[tuple, list[_Point]] = field(default_factory=dict)
    errors: list[float] = field(default_factory=list)
    seen: dict[str, None] = field(default_factory=dict)
    """the ids of the last `max_seen` measurements taken, oldest first (a dict: a lookup does not walk them)"""
    predicted: dict[tuple, float] = field(default_factory=dict)
    """configuration key -> predicted iteration time under `predicted_by`"""
    predicted_by: PerfParams | None = None
    anchors: Measurements | None = None
    """the agreed fitting points the parameters were seeded from: every refit keeps them"""
    bounds: dict[str, float] | None = None
    """the parameters' error bounds (`modeler.uncertainty.Uncertainty.margins`); None = not estimated"""
    waited: int = 0
    """measurements whose error entered the window since it last started again"""
    unpaid_in_a_row: int = 0
    """refits in a row that fitted and published nothing (`ModelerCore.refit_backoff`)"""
    unpaid: tuple | None = None
    """the last refit that published nothing: (the parameters it started from, what its points held, whether it
    started the window again); a refit of the same is answered the same way without fitting again"""


def _config_key(cfg: Config) -> tuple:
    p = cfg.plan
    return (p.dp, p.tp, p.pp, p.zero_stage, bool(p.offload), bool(p.gc), p.ga_steps, p.micro_batches,
            tuple(cfg.gpus_per_node), -1 if cfg.cpus_per_gpu is None else cfg.cpus_per_gpu, cfg.global_batch_size)


class ModelerCore:
    """See the module docstring. `params` seeds parameters per type (version 0, not published)."""

    name = NAME
    subjects = ("metrics.iteration", "metrics.iteration.>", "model.updated", "job.submitted")

    def __init__(self, models: Mapping[str, ModelType], env: Environment, params: Mapping[str, PerfParams] | None = None,
                 *, threshold: float = 0.10, window: int = 20, min_window: int = 5, per_config: int = 4,
                 max_configs: int = 64, max_seen: int = 4096, min_gain: float = 0.10,
                 anchors: Mapping[str, Measurements] | None = None,
                 bounds: Mapping[str, Mapping[str, float]] | None = None,
                 refit_folds: int = REFIT_FOLDS, refit_backoff: int = 0) -> None:
        if type(refit_backoff) is not int or not 0 <= refit_backoff <= MAX_REFIT_BACKOFF:
            raise ValueError(f"refit_backoff must be a whole number 0..{MAX_REFIT_BACKOFF}, got {refit_backoff!r}")
        self.env = env
        self.refit_backoff = refit_backoff
        self.threshold = threshold
        self.min_gain = min_gain
        self.window = window
        self.min_window = min_window
        self.per_config = per_config
        self.max_configs = max_configs
        self.max_seen = max_seen
        self.types: dict[str, _TypeState] = {}
        self.job_batch: dict[str, int] = {}
        self._seq = 0
        self.refit_folds = refit_folds
        self._shapes: dict[tuple, tuple[Config, tuple, tuple]] = {}
        """(plan, GPUs per node, CPUs per GPU, global batch, TP across nodes allowed) of a measurement -> its
        `Config`, `config_row` and `_config_key`: a running job reports the same configuration again and again.
        Emptied when it holds `max_shapes`."""
        self.max_shapes = 4096
        for key in sorted(models):
            self.types[key] = _TypeState(model=models[key], params=(params or {}).get(key),
                                         anchors=(anchors or {}).get(key),
                                         bounds=clean_bounds((bounds or {}).get(key)))

    # --- the core's interface -------------------------------------------------------------------------

    def handle(self, event: Event) -> list[Event]:
        if event.base == "job.submitted":
            self._job(event.payload)
            return []
        if event.subject == "model.updated":
            self._adopt(event.payload)
            return []
        if event.base == "metrics.iteration":
            return self._measured(event)
        return []

    def predict(self, model_type: str, configs: list[Config]) -> np.ndarray:
        st = self.types[model_type]
        if st.params is None:
            raise KeyError(f"model {model_type} has no fitted parameters yet")
        return self._predict_with(st, st.params, configs)

    def _predict_with(self, st: _TypeState, params: PerfParams, configs: list[Config]) -> np.ndarray:
        batch = ConfigBatch.from_configs(configs, allow_tp_across_nodes=st.model.allow_tp_across_nodes)
        return self._predict_batch(st, params, batch)

    def _predict_batch(self, st: _TypeState, params: PerfParams, batch: ConfigBatch) -> np.ndarray:
        return t_iter(st.model, self.env, params, resolve_ga(st.model, self.env, batch))

    def snapshot(self) -> dict:
        """The state as plain data (for tests and debugging): equal snapshots, equal behaviour."""
        out = {}
        for key in sorted(self.types):
            st = self.types[key]
            out[key] = {"version": st.version, "params": None if st.params is None else st.params.as_dict(),
                        "errors": list(st.errors), "waited": st.waited, "unpaid_in_a_row": st.unpaid_in_a_row,
                        "points": {repr(k): [(p.event_id, p.iter_time_s) for p in v]
                                   for k, v in sorted(st.points.items(), key=lambda kv: repr(kv[0]))}}
        return out

    # --- events ---------------------------------------------------------------------------------------

    def _job(self, job: JobSubmitted) -> None:
        self.job_batch[job.job_id] = job.global_batch_size
        spec = job.model.spec
        if job.model.type not in self.types and spec is not None and spec.fwd_time_s is not None:
            self.types[job.model.type] = _TypeState(model=ModelType(spec=spec))

    def _adopt(self, upd: ModelUpdated) -> None:
        st = self.types.get(upd.model_type)
        if st is None or upd.version <= st.version:
            return
        try:
            params = PerfParams.from_dict(dict(upd.params))
        except ValueError:
            return
        st.params, st.version = params, upd.version
        self._new_parameters(st)
        if upd.error_bounds is not None:
            st.bounds = clean_bounds(upd.error_bounds)

    def _reject(self, event: Event, m: MetricsIteration, reason: str, fld: str, expected: str = "",
                got: str = "") -> list[Event]:
        payload = Rejected(subject="metrics.iteration", reason=reason[:500], field=fld, expected=expected[:500],
                           got=got[:500], event_id=event.id[:128], job_id=m.job_id)
        return [make("metrics.rejected", payload, time=event.time, id=f"rej-{event.id}"[:128], source=NAME)]

    def _measured(self, event: Event) -> list[Event]:
        m: MetricsIteration = event.payload
        st = self.types.get(m.model_type)
        if st is None:
            return self._reject(event, m, "unknown model type", "model_type", "a model type with a spec", m.model_type)
        if event.id in st.seen:
            return []
        gbs = self.job_batch.get(m.job_id, st.model.spec.global_batch_size)
        allow = st.model.allow_tp_across_nodes
        shape = (m.plan, tuple(m.gpus_per_node), m.cpus_per_gpu, gbs, allow)
        known = self._shapes.get(shape)
        if known is None:  # a configuration not seen lately: checked, and its row and key made, once
            cfg = Config(plan=m.plan, gpus_per_node=shape[1], cpus_per_gpu=m.cpus_per_gpu, global_batch_size=gbs)
            try:
                row = config_row(cfg, allow_tp_across_nodes=allow)
            except ConfigError as exc:
                return self._reject(event, m, f"impossible configuration: {exc.detail}", "plan")
            if len(self._shapes) >= self.max_shapes:
                self._shapes.clear()
            known = self._shapes[shape] = (cfg, row, _config_key(cfg))
        cfg, row, key = known
        for name in ("fwd_s", "bwd_s", "opt_s"):
            part = getattr(m, name)
            if part is not None and part > m.iter_time_s:
                return self._reject(event, m, f"{name} is longer than the whole iteration", name,
                                    f"<= {m.iter_time_s!r}", repr(part))
        seen = st.seen
        seen[event.id] = None
        if len(seen) > self.max_seen:
            del seen[next(iter(seen))]
        fwd, bwd, opt = m.fwd_s, m.bwd_s, m.opt_s
        self._keep(st, _Point(self._seq, event.id, cfg, m.iter_time_s, np.nan if fwd is None else float(fwd),
                              np.nan if bwd is None else float(bwd), np.nan if opt is None else float(opt), row), key)
        self._seq += 1

        if st.params is None:
            return self._refit(event, m.model_type, st, "first fit")
        pred = self._predicted(st, row, key)
        errors = st.errors
        errors.append(abs(pred - m.iter_time_s) / m.iter_time_s)
        del errors[:-self.window]
        st.waited += 1
        mean = float(np.add.reduce(np.array(errors))) / len(errors)  # np.mean's own sum and division, fewer checks
        if len(errors) >= self.min_window and mean > self.threshold and st.waited >= self._wait(st):
            return self._refit(event, m.model_type, st,
                               f"rolling error {mean:.1%} > {self.threshold:.0%} over {len(errors)} points")
        return []

    def _wait(self, st: _TypeState) -> int:
        """Measurements the window must have taken since it started again before a refit (`refit_backoff`)."""
        return self.min_window << min(st.unpaid_in_a_row, self.refit_backoff)

    @staticmethod
    def _new_parameters(st: _TypeState) -> None:
        """The type's parameters changed (published or adopted): the window starts again and the run of unpaid refits
        ends."""
        st.errors, st.waited, st.unpaid_in_a_row = [], 0, 0

    def _unpaid(self, st: _TypeState) -> None:
        """A refit fitted and published nothing: the window starts again, and the next refit waits longer."""
        st.errors, st.waited = [], 0
        st.unpaid_in_a_row += 1

    def _predicted(self, st: _TypeState, row: tuple, key: tuple) -> float:
        """The current parameters' prediction for one configuration (`row`: its `config_row`, checked already; `key`:
        its `_config_key`), remembered until they change (a running job reports the same configuration again and
        again)."""
        if st.predicted_by is not st.params:
            st.predicted, st.predicted_by = {}, st.params
        pred = st.predicted.get(key)
        if pred is None:
            pred = st.predicted[key] = float(self._predict_batch(st, st.params, ConfigBatch.from_rows([row]))[0])
        return pred

    def _keep(self, st: _TypeState, point: _Point, key: tuple) -> None:
        """Keep `point` under its configuration's key (`_config_key`)."""
        kept = st.points.setdefault(key, [])
        kept.append(point)
        del kept[:-self.per_config]
        if len(st.points) > self.max_configs:  # drop the configuration measured longest ago
            oldest = min(st.points, key=lambda k: (st.points[k][-1].seq, repr(k)))
            del st.points[oldest]

    def _refit(self, event: Event, key: str, st: _TypeState, reason: str) -> list[Event]:
        pts = [p for k in sorted(st.points, key=repr) for p in st.points[k]]
        # a fit is a pure function of the points (configurations and times, in this order), the parameters it starts
        # from and the type's anchors: a refit of the same as the last one that published nothing does the same
        held = tuple((p.config, p.iter_time_s, p.fwd_s, p.bwd_s, p.opt_s) for p in pts)
        last = st.unpaid
        if last is not None and last[0] is st.params and last[1] == held:
            if last[2]:
                self._unpaid(st)
            return []
        result = seen = None
        for subset in (pts, [p for p in pts if not p.config.plan.offload]):
            if not subset:
                continue
            try:
                seen = _with_anchors(st.model, self.env, st.anchors, _measurements(st.model, subset))
                result = fit(st.model, self.env, seen, initial=st.params, multi_start=st.params is None)
                break
            except (FitError, ConfigError):
                continue
        if result is None or seen is None:
            st.unpaid = (st.params, held, False)  # no subset of the points can be fitted
            return []
        params = result.params
        if st.params is not None and not result.offload_fitted:  # keep what the points could not inform
            params = PerfParams.from_dict({**params.as_dict(),
                                           **{k: st.params.as_dict()[k] for k in OFFLOAD_PARAMS}})
        batch = resolve_ga(st.model, self.env, seen.batch)
        if st.params is not None and self.min_gain > 0:
            # the mean error on every point it has seen (the agreed fitting points and the kept ones)
            times = seen.iter_time_s
            old = float(np.mean(np.abs(t_iter(st.model, self.env, st.params, batch) - times) / times))
            new = float(np.mean(np.abs(t_iter(st.model, self.env, params, batch) - times) / times))
            if not new < old * (1 - self.min_gain):
                self._unpaid(st)  # no better: keep the parameters, and wait for a new window
                st.unpaid = (st.params, held, True)
                return []
        bounds = None
        if self.refit_folds > 1:
            sigma, used, by = out_of_fold(st.model, self.env, seen, result, folds=self.refit_folds)
            bounds = Uncertainty(sigma, used, by_family=by).margins() if used else None
        st.params, st.version, st.bounds, st.unpaid = params, st.version + 1, bounds, None
        self._new_parameters(st)
        payload = ModelUpdated(model_type=key, version=st.version, params=params.as_dict(),
                               n_points=result.n_points, rmsle=float(result.rmsle), reason=reason,
                               error_bounds=bounds)
        return [make("model.updated", payload, time=event.time, id=f"model-{key}-v{st.version}", source=NAME)]


def _batch_keys(model: ModelType, env: Environment, batch: ConfigBatch) -> list[tuple]:
    """What the model can tell of each configuration: plan, GA resolved, batch, CPUs (under offload),
    GPUs, nodes and the smallest node, and which groups cross nodes."""
    b = resolve_ga(model, env, batch)
    cols = (b.dp, b.tp, b.pp, b.zero_stage, b.offload, b.gc, b.ga_steps, b.micro_batches, b.global_batch,
            np.where(b.offload, np.nan_to_num(b.cpus, nan=-1.0), -1.0), b.gpus, b.nodes, b.min_node_gpus, b.dp_inter, b.tp_inter, b.pp_inter)
    return list(zip(*(c.tolist() for c in cols)))


def _with_anchors(model: ModelType, env: Environment, anchors: Measurements | None,
                  pts: Measurements) -> Measurements:
    """The agreed fitting points followed by the kept ones, as one set of measurements. A fitting point
    whose configuration the cluster measured itself is left out: the cluster's own measurements of it
    replace it (a drift on the measured configurations is followed; the rest stays anchored)."""
    if anchors is None:
        return pts
    measured = set(_batch_keys(model, env, pts.batch))
    keep = np.array([k not in measured for k in _batch_keys(model, env, anchors.batch)], dtype=bool)
    if not keep.any():
        return pts
    n, m = int(keep.sum()), len(pts.batch)
    col = lambda x, k, sel: np.full(k, np.nan) if x is None else np.asarray(x, dtype=np.float64)[sel]  # noqa: E731
    every = slice(None)
    batch = ConfigBatch(**{f: np.concatenate([getattr(anchors.batch, f)[keep], getattr(pts.batch, f)])
                           for f in anchors.batch.__dict__})
    return Measurements(batch=batch, iter_time_s=np.concatenate([anchors.iter_time_s[keep], pts.iter_time_s]),
                        fwd_s=np.concatenate([col(anchors.fwd_s, n, keep), col(pts.fwd_s, m, every)]),
                        bwd_sync_s=np.concatenate([col(anchors.bwd_sync_s, n, keep), col(pts.bwd_sync_s, m, every)]),
                        opt_s=np.concatenate([col(anchors.opt_s, n, keep), col(pts.opt_s, m, every)]))


def _measurements(model: ModelType, pts: list[_Point]) -> Measurements:
    batch = ConfigBatch.from_rows([p.row for p in pts])  # each checked when it was taken
    col = lambda name: np.asarray([getattr(p, name) for p in pts], dtype=np.float64)  # noqa: E731
    return Measurements(batch=batch, iter_time_s=col("iter_time_s"), fwd_s=col("fwd_s"), bwd_sync_s=col("bwd_s"),
                        opt_s=col("opt_s"))


def make_core(models_dir: Path | None = None, env_file: Path | None = None,
              fit_points: Path | None = None) -> ModelerCore:
    """The modeler core with the built-in model specs (`examples/models`), the testbed environment
    (`examples/envs/a800-8x8.yaml`) and parameters seeded from the artifact's fitting points
    (`data/rubick-artifact/fit_points.csv`) where that file exists, with their error bounds; those
    points stay in every refit. Reads files; the core does not."""
    from .env import DEFAULT_ENV_FILE, load_env
    from .spec import MODELS_DIR, load_model

    models_dir = models_dir or MODELS_DIR
    env = load_env(env_file or DEFAULT_ENV_FILE)
    models = {p.stem: load_model(p) for p in sorted(Path(models_dir).glob("*.yaml"))}
    models = {m.name: m for m in models.values()}
    fit_points = fit_points or Path(__file__).resolve().parent.parent / "data" / "rubick-artifact" / "fit_points.csv"
    seeds = seed_fits(models, env, Path(fit_points)) if Path(fit_points).is_file() else {}
    return ModelerCore(models, env, {k: v[0] for k, v in seeds.items()}, anchors={k: v[2] for k, v in seeds.items()},
                       bounds={k: v[1] for k, v in seeds.items() if v[1]})


def seed_fits(models: Mapping[str, ModelType], env: Environment,
              fit_points: Path) -> dict[str, tuple[PerfParams, dict[str, float], Measurements]]:
    """Per model type with fitting points in the file: (parameters, error bounds, the points)."""
    from .validate import points_by_model

    out = {}
    for key, pts in points_by_model(models, fit_points).items():
        try:
            result = fit(models[key], env, pts)
        except FitError:
            continue
        unc = estimate(models[key], env, pts, result, n_samples=0)
        out[key] = (result.params, unc.margins() if unc.folds else {}, pts)
    return out
