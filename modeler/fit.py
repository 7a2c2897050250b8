"""Fitting the parameters of one model type by minimising RMSLE (scipy, bounded, multi-start).

The residual of a measured point is log(predicted / measured) of its iteration time, so the fit
minimises the root mean squared log error. Where a point also has a breakdown (forward,
backward+sync, optimizer; 0 or NaN = not recorded) two parts are compared too, with a smaller
weight: forward + backward + synchronisation against T_cc, and the optimizer step against T_oo.
Under ZeRO-Offload only their sum is compared: DeepSpeed copies gradients to the host during the
backward, so where the offload traffic is recorded (backward or step) depends on the engine, not on
the model. They pin down the optimizer terms that total times alone leave loose.
Each parameter also carries a weak prior (a residual `PRIOR_WEIGHT * log(k / prior)`): where the
points do not determine a parameter (k_sync when no point crosses nodes, k_pp when every point
has the same number of stages) it stays near its prior instead of drifting to a bound; where they
do, the data outweighs it (weight 0.01 against 1 for a point's log error).
A soft-L1 loss keeps one bad measurement from dragging the fit, and the fit runs from several
starting points and keeps the best, so a bad start does not decide the answer.

Requirements (the paper's): at least `MIN_POINTS` measured points, where a breakdown part counts
as a measurement of its own; and, when ZeRO-Offload is to be predicted, at least
`MIN_OFFLOAD_POINTS` of them under ZeRO-Offload (counted the same way). With no offload point at all the three
offload parameters are left at their defaults and marked unfitted. The engine parameters are fitted
only where a point informs them: k_3d where a point has tp * pp > 1, k_tp where tp > 1, k_pp where
pp > 1. Pure code: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Hashable, Sequence

import numpy as np

from .configs import ConfigBatch
from .env import Environment
from .memory import resolve_ga
from .perf_model import ENGINE_PARAMS, OFFLOAD_PARAMS, PARAM_NAMES, PP_PARAMS, TP_PARAMS, PerfParams, fixed_parts, parts
from .spec import ModelType

MIN_POINTS = 7
MIN_OFFLOAD_POINTS = 3
BREAKDOWN_WEIGHT = 0.3
"""Weight of a breakdown part's log error relative to the iteration time's."""
DUPLICATE_TOLERANCE = 0.10
"""Rows of one configuration whose times differ by more than this (relative) conflict."""
PART_SLACK = 0.05
"""How much longer than the iteration a breakdown part may be (timer noise) before it is refused."""

BOUNDS: dict[str, tuple[float, float]] = {
    "k_bwd": (0.3, 8.0),
    "k_sync": (1.0, 50.0),
    "k_opt": (1e-4, 1e3),       # ns per parameter
    "k_opt_off": (1e-2, 1e4),   # ns per parameter per CPU thread
    "k_off": (1.0, 50.0),
    "k_swap": (1.0, 50.0),
    "k_const": (1e-5, 100.0),   # s
    "k_3d": (0.2, 10.0),
    "k_tp": (0.1, 100.0),
    "k_pp": (1e-4, 1.0),        # s per pipeline step
}
PRIORS: dict[str, float] = {
    # backward twice the forward; no overlap (k = 1) of gradient sync and offload traffic, which is
    # what the fitting points that cross nodes show (gpt2 GC on 4 nodes, the LLaMA 3D plans fit
    # k_sync 1.0-1.07); the others typical of the fits on the artifact's points; the engine's neutral
    "k_bwd": 2.0, "k_sync": 1.0, "k_opt": 0.1, "k_opt_off": 5.0, "k_off": 1.0, "k_swap": 1.0, "k_const": 0.05,
    "k_3d": 1.0, "k_tp": 1.0, "k_pp": 0.01,
}
PRIOR_WEIGHT = 0.01
"""Weight of a parameter's log distance from its prior, relative to a point's log error."""
STARTS: tuple[dict[str, float], ...] = (
    {},
    {"k_bwd": 1.0, "k_sync": 1.2, "k_opt": 0.02, "k_opt_off": 5.0, "k_off": 1.2, "k_swap": 1.2, "k_const": 0.001},
    {"k_bwd": 3.0, "k_sync": 8.0, "k_opt": 1.0, "k_opt_off": 100.0, "k_off": 8.0, "k_swap": 8.0, "k_const": 0.05},
)


class FitError(ValueError):
    """The points cannot determine the parameters; the message says what is missing."""


@dataclass(frozen=True)
class Measurements:
    """Measured points: iteration time (s) and optional breakdown parts (s; NaN or 0 = not recorded).
    `labels` are the points' row numbers in the file they came from (1 = the first data row), for errors;
    without them errors count points from 1."""

    batch: ConfigBatch
    iter_time_s: np.ndarray
    fwd_s: np.ndarray | None = None
    bwd_sync_s: np.ndarray | None = None
    opt_s: np.ndarray | None = None
    labels: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        n = len(self.batch)
        for name in ("iter_time_s", "fwd_s", "bwd_sync_s", "opt_s"):
            arr = getattr(self, name)
            if arr is not None and np.shape(arr) != (n,):
                raise ValueError(f"{name} has {np.shape(arr)} entries for {n} configurations")
        if self.labels is not None and len(self.labels) != n:
            raise ValueError(f"{len(self.labels)} labels for {n} configurations")
        t = np.asarray(self.iter_time_s, dtype=np.float64)
        bad = ~(np.isfinite(t) & (t > 0))
        if bad.any():
            raise FitError(f"{rows_text(self.row_labels(bad))}: the iteration time must be a finite time > 0 s, got "
                           + ", ".join(repr(float(v)) for v in t[bad][:8]))
        for name in ("fwd_s", "bwd_sync_s", "opt_s"):
            arr = getattr(self, name)
            if arr is None:
                continue
            v = np.asarray(arr, dtype=np.float64)
            neg = v < 0
            if neg.any():
                raise FitError(f"{rows_text(self.row_labels(neg))}: breakdown part {name} must be >= 0 s (0 or "
                               "empty = not recorded), got " + ", ".join(repr(float(x)) for x in v[neg][:8]))
            over = np.isfinite(v) & (v > t * (1 + PART_SLACK))
            if over.any():
                raise FitError(f"{rows_text(self.row_labels(over))}: breakdown part {name} is longer than the "
                               "whole iteration")

    def row_labels(self, mask: np.ndarray | None = None) -> list[int]:
        labels = self.labels if self.labels is not None else tuple(range(1, len(self.batch) + 1))
        return [lab for lab, m in zip(labels, np.ones(len(labels), bool) if mask is None else mask) if m]


def rows_text(labels: Sequence[int]) -> str:
    """'row 3', 'rows 2 and 8', 'rows 1, 4 and 5' (at most ten named)."""
    labels = list(labels)
    if len(labels) == 1:
        return f"row {labels[0]}"
    shown = [str(x) for x in labels[:10]] + ([f"{len(labels) - 10} more"] if len(labels) > 10 else [])
    return "rows " + ", ".join(shown[:-1]) + " and " + shown[-1]


def check_duplicates(keys: Sequence[Hashable], times: Sequence[float], labels: Sequence[int]) -> None:
    """FitError when rows with the same configuration disagree on its time by more than
    `DUPLICATE_TOLERANCE` (repeated measurements closer than that are kept, all of them)."""
    groups: dict[Hashable, list[tuple[int, float]]] = {}
    for key, t, lab in zip(keys, times, labels):
        groups.setdefault(key, []).append((lab, float(t)))
    clashes = [g for g in groups.values()
               if len(g) > 1 and max(t for _, t in g) > min(t for _, t in g) * (1 + DUPLICATE_TOLERANCE)]
    if clashes:
        raise FitError("; ".join(
            f"{rows_text([lab for lab, _ in g])} are the same configuration with conflicting times "
            f"({', '.join(f'{t:.6g}' for _, t in g)} s, more than {DUPLICATE_TOLERANCE:.0%} apart)"
            for g in clashes[:5]) + ": keep one measurement, or repeat it until they agree")


@dataclass(frozen=True)
class FitResult:
    params: PerfParams
    fitted: tuple[str, ...]
    n_points: int
    n_offload_points: int
    rmsle: float
    """RMS of log(predicted / measured) iteration time over the points."""

    @property
    def offload_fitted(self) -> bool:
        return all(p in self.fitted for p in OFFLOAD_PARAMS)


def _part(values: np.ndarray | None, n: int) -> np.ndarray:
    if values is None:
        return np.full(n, np.nan)
    v = np.asarray(values, dtype=np.float64)
    return np.where(np.isfinite(v) & (v > 0), v, np.nan)


def _counted(pts: Measurements) -> np.ndarray:
    """Measurements per point: its iteration time plus each recorded breakdown part."""
    n = len(pts.batch)
    return sum(np.isfinite(_part(x, n)).astype(int) for x in (pts.fwd_s, pts.bwd_sync_s, pts.opt_s)) + 1


def check_points(model: ModelType, pts: Measurements, *, need_offload: bool = False,
                 active: np.ndarray | None = None, n_params: int = 0) -> tuple[int, int]:
    """(measurements, offload measurements) of the points (only those `active`), or FitError naming
    the rows and what is missing. `n_params`: the parameters to fit, which the measurements must not
    be fewer than."""
    mask = np.ones(len(pts.batch), bool) if active is None else np.asarray(active, bool)
    n = int(mask.sum())
    seen = np.where(mask, _counted(pts), 0)
    measurements = int(seen.sum())
    off = pts.batch.offload & mask
    n_off = int(seen[off].sum())
    rows = f" ({rows_text(pts.row_labels(mask))})" if n else ""
    need = max(MIN_POINTS, n_params)
    if measurements < need:
        raise FitError(f"model {model.name}: {n} measured point(s){rows}, {measurements} measurements with "
                       f"their breakdown parts; at least {need} are needed to fit "
                       + (f"{n_params} parameters" if n_params > MIN_POINTS else "the seven parameters"))
    if (need_offload or n_off) and n_off < MIN_OFFLOAD_POINTS:
        offr = f" ({rows_text(pts.row_labels(off))})" if off.any() else ""
        raise FitError(f"model {model.name}: {int(off.sum())} ZeRO-Offload point(s){offr}, {n_off} measurements "
                       f"with their breakdown parts; at least {MIN_OFFLOAD_POINTS} are needed to fit k_opt_off, "
                       "k_off and k_swap")
    if n < 2:
        raise FitError(f"model {model.name}: {n} measured iteration time(s){rows}; at least 2 are needed")
    return measurements, n_off


def load_solver() -> None:
    """Import the least-squares solver now. It takes about half a second, so `fit` imports it only when
    a fit runs: a short offline run or a replay that never refits skips it. A long-running service
    calls this at start-up instead, so that its first online refit does not stall its event loop."""
    import scipy.optimize  # noqa: F401


def fit(model: ModelType, env: Environment, pts: Measurements, *, need_offload: bool = False,
        initial: PerfParams | None = None, multi_start: bool = True, weights: np.ndarray | None = None,
        names: Sequence[str] | None = None, strict: bool = True) -> FitResult:
    """Fit the parameters of `model` on the measured points. With `initial` and not `multi_start`
    (an online refit), only the warm start is tried: the refit follows a drift, it does not
    search the whole space again. `weights` (one per point, >= 0; 0 leaves the point out) weigh the
    points' residuals; `names` fixes which parameters are fitted (else those the points inform).
    `strict=False` skips the minimum point counts: for refits of a fit that met them, with some points
    weighed down or left out (the error bounds of `modeler.uncertainty`), where the priors keep what
    the remaining points do not inform."""
    w = np.ones(len(pts.batch)) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (len(pts.batch),) or not np.all(np.isfinite(w) & (w >= 0)):
        raise ValueError("weights must be one finite number >= 0 per point")
    active = w > 0
    if strict:
        _, n_off = check_points(model, pts, need_offload=need_offload, active=active)
    else:
        if not active.any():
            raise FitError(f"model {model.name}: every point has weight 0")
        n_off = int(_counted(pts)[pts.batch.offload & active].sum())
    batch = resolve_ga(model, env, pts.batch)
    if names is None:
        on = batch.take(active)
        informs = {"3d": bool((on.tp * on.pp > 1).any()), "tp": bool((on.tp > 1).any()), "pp": bool((on.pp > 1).any())}
        names = [k for k in PARAM_NAMES if (n_off or k not in OFFLOAD_PARAMS)
                 and (informs["3d"] or k not in ENGINE_PARAMS)
                 and (informs["tp"] or k not in TP_PARAMS) and (informs["pp"] or k not in PP_PARAMS)]
        if strict:
            check_points(model, pts, need_offload=need_offload, active=active, n_params=len(names))
    names = list(names)
    sw = np.sqrt(w)
    base = initial or PerfParams()
    n = len(pts.batch)
    meas = np.log(pts.iter_time_s)
    fwd, bws, opt = (_part(x, n) for x in (pts.fwd_s, pts.bwd_sync_s, pts.opt_s))
    off = batch.offload
    # the recorded parts: forward + backward + sync (T_cc) and the step (T_oo); under offload their sum
    cc_ok = np.isfinite(fwd) & np.isfinite(bws) & ~off
    oo_ok = np.isfinite(opt) & ~off
    sum_ok = np.isfinite(fwd) & np.isfinite(bws) & np.isfinite(opt) & off
    log_cc = np.log(np.where(cc_ok, fwd + bws, 1.0))
    log_oo = np.log(np.where(oo_ok, opt, 1.0))
    log_sum = np.log(np.where(sum_ok, fwd + bws + opt, 1.0))
    lo = np.log([BOUNDS[k][0] for k in names])
    hi = np.log([BOUNDS[k][1] for k in names])
    prior = np.log([PRIORS[k] for k in names])
    fixed = base.as_dict()

    def params_of(z: np.ndarray) -> PerfParams:
        """Parameters for z of shape (len(names),), or arrays of shape (k, 1) for z of shape (k, len(names))."""
        if z.ndim == 1:
            return replace(base, **{k: float(np.exp(v)) for k, v in zip(names, z)})
        vals = {k: np.exp(z[:, i:i + 1]) for i, k in enumerate(names)}
        vals.update({k: np.full((z.shape[0], 1), v) for k, v in fixed.items() if k not in vals})
        return PerfParams(**vals)

    unmoved = fixed_parts(model, env, batch)  # what no parameter changes: once for every evaluation below

    def residuals_many(z: np.ndarray) -> np.ndarray:
        """Residuals for k parameter vectors at once: z (k, len(names)) -> (k, residuals)."""
        pr = parts(model, env, params_of(z), batch, unmoved)
        tiny = 1e-12
        return np.concatenate([
            sw * (np.log(pr.t_iter) - meas),
            sw * BREAKDOWN_WEIGHT * np.where(cc_ok, np.log(np.maximum(pr.t_cc, tiny)) - log_cc, 0.0),
            sw * BREAKDOWN_WEIGHT * np.where(oo_ok, np.log(np.maximum(pr.t_oo, tiny)) - log_oo, 0.0),
            sw * BREAKDOWN_WEIGHT * np.where(sum_ok, np.log(np.maximum(pr.t_cc + pr.t_oo, tiny)) - log_sum, 0.0),
            PRIOR_WEIGHT * (z - prior),
        ], axis=1)

    def residuals(z: np.ndarray) -> np.ndarray:
        return residuals_many(z[None, :])[0]

    def jacobian(z: np.ndarray) -> np.ndarray:
        # forward differences, every parameter's step in one vectorised evaluation
        h = 1e-6 * np.maximum(1.0, np.abs(z))
        step = np.where(z + h > hi, -h, h)  # stay inside the bounds (step backwards at the upper one)
        r = residuals_many(np.vstack([z, z + np.diag(step)]))
        return ((r[1:] - r[0]) / step[:, None]).T

    from scipy.optimize import least_squares  # half a second to import: only where a fit runs

    best = None
    if initial is None:
        starts = STARTS
    else:
        starts = (base.as_dict(),) + (STARTS if multi_start else ())
    for start in starts:
        x0 = np.clip(np.log([start.get(k, getattr(PerfParams(), k) or PRIORS[k]) for k in names]), lo + 1e-9, hi - 1e-9)
        res = least_squares(residuals, x0, jac=jacobian, bounds=(lo, hi), loss="soft_l1", f_scale=0.1,
                            method="trf", xtol=1e-6, ftol=1e-6, max_nfev=200)
        if best is None or res.cost < best.cost:
            best = res
    params = params_of(best.x)
    err = (np.log(parts(model, env, params, batch, unmoved).t_iter) - meas)[active]
    return FitResult(params=params, fitted=tuple(names), n_points=int(active.sum()), n_offload_points=n_off,
                     rmsle=float(np.sqrt(np.mean(err ** 2))))
