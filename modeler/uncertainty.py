"""How far a fitted model's predictions can be trusted: an error bound for every prediction.

Two sources of error, both measured on the fitting points themselves (docs/modeler.md, "Error bounds"):

- **Out-of-fold error** (`sigma_cv`): the points are split into `folds` folds (point i in fold
  i mod folds, in the points' order); each fold is predicted by the parameters fitted on the others
  (warm-started from the full fit), and `sigma_cv` is the root mean square of those predictions' log
  errors. With 10 points or fewer every point is its own fold (leave-one-out). It is what the fit
  cannot see in its own residuals: a point predicted without having been fitted on, where the
  model's form is wrong or a parameter rests on that point alone.
- **Parameter spread** (`samples`): the parameters fitted again under `n_samples` Bayesian-bootstrap
  reweightings of the points (Dirichlet(1, ..., 1) weights, seeded: the same points give the same
  samples). Configurations far from the fitting points (other plans, more nodes) spread more.

A prediction t gets sigma = sqrt(sigma_f^2 + s^2), where sigma_f is the out-of-fold error of the fitting
points of its plan family (3D, ZeRO-Offload, ZeRO, GC, DP; `sigma_cv` for a family without fitting
points) and s the standard deviation of log t over the samples, and the interval [t exp(-z sigma), t exp(z sigma)] with z = 1.645 (90% two-sided under a normal
log error). The type's margin, `exp(z sigma_cv) - 1`, is what the policy asks a guaranteed job's
predicted gain to clear before it leaves its own plan. Pure code: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .configs import ConfigBatch
from .env import Environment
from .fit import FitError, FitResult, Measurements, fit
from .memory import resolve_ga
from .perf_model import PARAM_NAMES, PerfParams, t_iter
from .spec import ModelType

Z = 1.645
"""Standard normal quantile of the bounds: 90% of log errors inside +-Z sigma if they are normal."""
FOLDS = 10
SAMPLES = 16
SEED = 0


FAMILIES = ("DP", "GC", "ZeRO", "ZeRO-Offload", "3D")
ALL = "all"
"""The key of a type's overall bound among its per-family ones (`Uncertainty.margins`)."""


def clean_bounds(bounds: Mapping[str, float] | None) -> dict[str, float] | None:
    """Error bounds as published (`modeler.uncertainty.Uncertainty.margins`), keeping only known plan families
    (and `all`) with a finite value >= 0; None when none is left."""
    if not bounds:
        return None
    out = {k: float(v) for k, v in sorted(bounds.items())
           if k in (ALL, *FAMILIES) and isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < float("inf")}
    return out or None


def plan_family(plan) -> str:
    """One plan's family (a `controlplane.events.Plan`), as `families` names them."""
    if plan.tp * plan.pp > 1:
        return "3D"
    if plan.offload:
        return "ZeRO-Offload"
    if plan.zero_stage:
        return "ZeRO"
    return "GC" if plan.gc else "DP"


def bound_for(bounds, plan) -> float | None:
    """The bound of `plan`'s family from a type's bounds (`Uncertainty.margins`), the overall one where
    its family has none; None without bounds."""
    if not bounds:
        return None
    if plan is not None:
        hit = bounds.get(plan_family(plan))
        if hit is not None:
            return hit
    return bounds.get(ALL)


def families(batch: ConfigBatch) -> np.ndarray:
    """Each configuration's plan family: 3D (tp * pp > 1), ZeRO-Offload, ZeRO, GC or DP, in that order."""
    out = np.full(len(batch), "DP", dtype=object)
    out[batch.gc] = "GC"
    out[batch.zero_stage > 0] = "ZeRO"
    out[batch.offload] = "ZeRO-Offload"
    out[batch.tp * batch.pp > 1] = "3D"
    return out


@dataclass(frozen=True)
class Uncertainty:
    sigma_cv: float
    """root mean square out-of-fold log error of the iteration time over the fitting points"""
    folds: int
    samples: tuple[PerfParams, ...] = ()
    z: float = Z
    by_family: tuple[tuple[str, float], ...] = ()
    """(plan family, RMS out-of-fold log error of its fitting points) for the families with points"""

    @property
    def margin(self) -> float:
        """The relative bound of the type: a prediction may be this much too fast (exp(z sigma_cv) - 1)."""
        return math.expm1(self.z * self.sigma_cv)

    def as_dict(self) -> dict:
        return {"sigma_cv": self.sigma_cv, "folds": self.folds, "z": self.z, "margin": self.margin,
                "by_family": dict(self.by_family), "samples": [p.as_dict() for p in self.samples]}

    def margins(self) -> dict[str, float]:
        """The relative bounds (exp(z sigma) - 1, rounded to 6 digits) the policy uses as its guarantee
        margins: under `ALL` the type's, and one per plan family with fitting points."""
        out = {ALL: round(self.margin, 6)}
        out.update((f, round(math.expm1(self.z * s), 6)) for f, s in self.by_family)
        return out

    def family_sigma(self, family: str) -> float:
        """A family's out-of-fold sigma; the overall one for a family without fitting points."""
        return dict(self.by_family).get(family, self.sigma_cv)

    @staticmethod
    def from_dict(doc: object) -> "Uncertainty":
        if not isinstance(doc, dict):
            raise ValueError("uncertainty must be a map with sigma_cv, folds and samples")
        try:
            sigma, folds, z = float(doc["sigma_cv"]), int(doc["folds"]), float(doc.get("z", Z))
        except (KeyError, TypeError, ValueError):
            raise ValueError("uncertainty needs sigma_cv (a number) and folds (an integer)") from None
        if not (math.isfinite(sigma) and sigma >= 0 and folds >= 0 and math.isfinite(z) and z > 0):
            raise ValueError(f"uncertainty: sigma_cv must be >= 0, folds >= 0 and z > 0; got {sigma}, {folds}, {z}")
        samples, fam = doc.get("samples", []), doc.get("by_family", {})
        if not isinstance(samples, list):
            raise ValueError("uncertainty samples must be a list of parameter maps")
        if not isinstance(fam, dict) or any(k not in FAMILIES or isinstance(v, bool) or not isinstance(v, (int, float))
                                            or not math.isfinite(v) or v < 0 for k, v in fam.items()):
            raise ValueError(f"uncertainty by_family must map plan families ({', '.join(FAMILIES)}) to sigmas >= 0")
        return Uncertainty(sigma, folds, tuple(PerfParams.from_dict(s) for s in samples), z,
                           tuple(sorted((k, float(v)) for k, v in fam.items())))


def out_of_fold(model: ModelType, env: Environment, pts: Measurements, result: FitResult, *,
                folds: int = FOLDS) -> tuple[float, int, tuple[tuple[str, float], ...]]:
    """(sigma_cv, folds used, sigma per plan family). The refits skip the minimum point counts (a
    parameter that only the left-out points inform falls back to its prior, and the error shows it);
    a fold whose refit fails is skipped, and the folds used say how many were not."""
    n = len(pts.batch)
    k = min(folds, n)
    err = np.full(n, np.nan)
    used = 0
    batch = resolve_ga(model, env, pts.batch)
    for f in range(k):
        out = np.arange(f, n, k)
        w = np.ones(n)
        w[out] = 0.0
        try:
            res = fit(model, env, pts, initial=result.params, multi_start=False, weights=w, names=result.fitted,
                      strict=False)
        except FitError:
            continue
        used += 1
        err[out] = np.log(t_iter(model, env, res.params, batch.take(out))) - np.log(pts.iter_time_s[out])
    ok = np.isfinite(err)
    if not ok.any():
        return float(result.rmsle), 0, ()
    fam = families(batch)
    by = tuple((f, float(np.sqrt(np.mean(err[ok & (fam == f)] ** 2)))) for f in FAMILIES if (ok & (fam == f)).any())
    return float(np.sqrt(np.mean(err[ok] ** 2))), used, by


def bootstrap(model: ModelType, env: Environment, pts: Measurements, result: FitResult, *,
              n_samples: int = SAMPLES, seed: int = SEED) -> tuple[PerfParams, ...]:
    """Parameters refitted under Bayesian-bootstrap weights (warm-started from `result`)."""
    rng = np.random.default_rng(seed)
    n = len(pts.batch)
    out = []
    for _ in range(n_samples):
        w = rng.dirichlet(np.ones(n)) * n
        try:
            out.append(fit(model, env, pts, initial=result.params, multi_start=False, weights=w,
                           names=result.fitted, strict=False).params)
        except FitError:
            continue
    return tuple(out)


def estimate(model: ModelType, env: Environment, pts: Measurements, result: FitResult, *,
             folds: int = FOLDS, n_samples: int = SAMPLES, seed: int = SEED) -> Uncertainty:
    """The fit's uncertainty (out-of-fold error and bootstrap samples) on the points it was fitted on."""
    sigma, used, by = out_of_fold(model, env, pts, result, folds=folds)
    samples = bootstrap(model, env, pts, result, n_samples=n_samples, seed=seed) if n_samples else ()
    return Uncertainty(sigma, used, samples, by_family=by)


def sigmas(model: ModelType, env: Environment, params: PerfParams, unc: Uncertainty,
           batch: ConfigBatch) -> np.ndarray:
    """The log-error sigma of each configuration's prediction (`batch` with GA resolved)."""
    spread = np.zeros(len(batch))
    if len(unc.samples) > 1 and len(batch):
        stacked = PerfParams(**{k: np.asarray([getattr(s, k) for s in unc.samples])[:, None] for k in PARAM_NAMES})
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(t_iter(model, env, stacked, batch))
        finite = np.all(np.isfinite(logs), axis=0)
        spread = np.where(finite, np.std(np.where(np.isfinite(logs), logs, 0.0), axis=0), np.inf)
    fam = families(batch)
    base = np.array([unc.family_sigma(f) for f in fam]) if len(batch) else np.zeros(0)
    return np.sqrt(base ** 2 + spread ** 2)


def interval(model: ModelType, env: Environment, params: PerfParams, unc: Uncertainty,
             batch: ConfigBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(predicted, low, high) seconds per iteration for each configuration (`batch` with GA resolved)."""
    pred = t_iter(model, env, params, batch)
    s = sigmas(model, env, params, unc, batch)
    return pred, pred * np.exp(-unc.z * s), pred * np.exp(unc.z * s)
