"""`rubick model fit | predict | validate`: the performance model on measured data."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from .configs import ConfigError, check_columns
from .env import DEFAULT_ENV_FILE, EnvError, load_env
from .fit import FitError, check_duplicates, fit
from .memory import feasible, resolve_ga
from .perf_model import OFFLOAD_PARAMS, PerfParams, t_iter
from .spec import MODELS_DIR, SpecError, load_model
from .uncertainty import Uncertainty, estimate, interval
from .validate import MODEL_KEYS, duplicate_key, format_report, measurements, validate

PARAMS_FORMAT = 1


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


def register(subparsers: Any) -> None:
    model = subparsers.add_parser("model", help="fit, predict and validate the performance model")
    sub = model.add_subparsers(dest="model_command", metavar="SUBCOMMAND")
    model.set_defaults(func=lambda args: _usage(model))

    p = sub.add_parser("fit", help="fit one model type's parameters on measured points")
    p.add_argument("--spec", required=True, help="model spec YAML (examples/models/<key>.yaml)")
    p.add_argument("--points", required=True, help="CSV of measured points (the columns of fit_points.csv)")
    p.add_argument("--env", default=str(DEFAULT_ENV_FILE), help="cluster environment YAML")
    p.add_argument("--out", required=True, help="where to write the fitted parameters (JSON)")
    p.add_argument("--need-offload", action="store_true",
                   help="fail unless the points can fit the ZeRO-Offload parameters too")
    p.set_defaults(func=_guard(cmd_fit))

    p = sub.add_parser("predict", help="predict iteration time and memory feasibility for configurations")
    p.add_argument("--spec", required=True)
    p.add_argument("--params", required=True, help="parameters written by `rubick model fit`")
    p.add_argument("--configs", required=True, help="CSV of configurations (the columns of fit_points.csv)")
    p.add_argument("--env", default=str(DEFAULT_ENV_FILE))
    p.add_argument("--out", required=True, help="CSV written back with pred_iter_time_s, feasible and the error "
                   "bounds pred_low_s, pred_high_s and pred_error_pct (90%%) added")
    p.set_defaults(func=_guard(cmd_predict))

    p = sub.add_parser("validate", help="fit on fit_points.csv, predict the rest of throughput_table.csv")
    p.add_argument("--data", required=True, help="folder with fit_points.csv and throughput_table.csv")
    p.add_argument("--models", default=str(MODELS_DIR), help="folder of <key>.yaml model specs")
    p.add_argument("--env", default=str(DEFAULT_ENV_FILE))
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show progress on stderr (default: only when stderr is a terminal)")
    p.set_defaults(func=_guard(cmd_validate))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _guard(handler):
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except (CliError, ConfigError, EnvError, SpecError, FitError) as exc:
            print(f"rubick model {args.model_command}: {exc}", file=sys.stderr)
            return 2
    return run


def _read_csv(path: str) -> pl.DataFrame:
    p = Path(path)
    if not p.is_file():
        raise CliError(f"no such file: {p}")
    try:
        return pl.read_csv(p, infer_schema_length=0)
    except Exception as exc:  # polars raises several error types for malformed files
        raise CliError(f"{p}: not a readable CSV ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None


def cmd_fit(args: argparse.Namespace) -> int:
    model = load_model(args.spec)
    env = load_env(args.env)
    frame = _read_csv(args.points)
    try:
        check_columns(frame.columns)
    except ConfigError as exc:
        raise CliError(f"{args.points}: {exc}") from None
    if "iter_time_s" not in frame.columns:
        raise CliError(f"{args.points}: no iter_time_s column (measured seconds per iteration)")
    records = frame.to_dicts()
    if "model" in frame.columns:
        numbered = [(i + 1, r) for i, r in enumerate(records) if r["model"] == model.name]
    else:
        numbered = list(enumerate(records, start=1))
    if not numbered:
        raise CliError(f"{args.points}: no row has model = {model.name!r}")
    # validate each row with its own line number in the file (every bad row named), then fit on the chosen rows
    problems = []
    for row, rec in numbered:
        try:
            measurements(model, [rec])
        except (ConfigError, FitError) as exc:
            problems.append(f"row {row}: {getattr(exc, 'detail', None) or str(exc).split(': ', 1)[-1]}")
    if problems:
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise CliError(f"{args.points}: {len(problems)} bad row(s){more}: " + "; ".join(problems[:10]))
    rows = [row for row, _ in numbered]
    pts = measurements(model, [r for _, r in numbered], labels=rows)
    check_duplicates([duplicate_key(r) for _, r in numbered], pts.iter_time_s, rows)
    result = fit(model, env, pts, need_offload=args.need_offload)
    unc = estimate(model, env, pts, result)
    doc = {"format": PARAMS_FORMAT, "model": model.name, "env": env.name, "params": result.params.as_dict(),
           "fitted": list(result.fitted), "offload_fitted": result.offload_fitted, "n_points": result.n_points,
           "n_offload_points": result.n_offload_points, "rmsle": result.rmsle, "uncertainty": unc.as_dict(),
           "units": {"k_bwd": "1", "k_sync": "1", "k_opt": "ns per parameter (GPU)",
                     "k_opt_off": "ns per parameter per CPU thread", "k_off": "1", "k_swap": "1", "k_const": "s"}}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    note = "" if result.offload_fitted else " (no ZeRO-Offload points: offload parameters not fitted)"
    print(f"{model.name}: fitted on {result.n_points} points, RMSLE {result.rmsle:.4f}{note}")
    print(f"  error bound: out-of-fold RMS log error {unc.sigma_cv:.4f} over {unc.folds} folds, "
          f"{len(unc.samples)} bootstrap refits; predictions may be {unc.margin:.1%} too fast (90%)")
    print("  " + "  ".join(f"{k}={v:.6g}" for k, v in result.params.as_dict().items()))
    print(f"wrote {args.out}")
    return 0


def _load_params(path: str, model_name: str) -> tuple[PerfParams, bool, Uncertainty | None]:
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as exc:
        raise CliError(f"cannot read parameters {p}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise CliError(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or "params" not in doc:
        raise CliError(f"{p}: expected the JSON written by `rubick model fit` (with a params map)")
    if doc.get("model") not in (None, model_name):
        raise CliError(f"{p}: parameters are for model {doc['model']!r}, the spec is {model_name!r}")
    try:
        params = PerfParams.from_dict(doc["params"])
        unc = Uncertainty.from_dict(doc["uncertainty"]) if doc.get("uncertainty") is not None else None
    except ValueError as exc:
        raise CliError(f"{p}: {exc}") from None
    return params, bool(doc.get("offload_fitted", True)), unc


def cmd_predict(args: argparse.Namespace) -> int:
    model = load_model(args.spec)
    env = load_env(args.env)
    params, offload_fitted, unc = _load_params(args.params, model.name)
    frame = _read_csv(args.configs)
    try:
        check_columns(frame.columns)
    except ConfigError as exc:
        raise CliError(f"{args.configs}: {exc}") from None
    records = frame.to_dicts()
    # rows of other model types are written back unpredicted (empty), as `fit` ignores them
    mine = [i for i, r in enumerate(records) if r.get("model") in (None, "", model.name)]
    if not mine:
        raise CliError(f"{args.configs}: no row has model = {model.name!r}")
    batch = _numbered_batch([(i + 1, records[i]) for i in mine], model.allow_tp_across_nodes)
    if not offload_fitted and batch.offload.any():
        row = mine[int(np.argmax(batch.offload))] + 1
        raise ConfigError(f"ZeRO-Offload configuration, but {', '.join(OFFLOAD_PARAMS)} were not fitted "
                          "(the fit had no ZeRO-Offload points)", row)
    batch = resolve_ga(model, env, batch)
    times = t_iter(model, env, params, batch)
    ok = feasible(model, env, batch)
    low = high = None
    if unc is not None:
        _, low, high = interval(model, env, params, unc, batch)
    cols: dict[str, list] = {c: [None] * len(records) for c in ("pred_iter_time_s", "feasible", "pred_low_s",
                                                                "pred_high_s", "pred_error_pct")}
    for j, i in enumerate(mine):
        cols["pred_iter_time_s"][i], cols["feasible"][i] = float(times[j]), int(ok[j])
        if low is not None:
            cols["pred_low_s"][i], cols["pred_high_s"][i] = float(low[j]), float(high[j])
            cols["pred_error_pct"][i] = round(float(high[j] / times[j] - 1.0) * 100.0, 3)
    out = frame.with_columns(*(pl.Series(c, v, dtype=pl.Int64 if c == "feasible" else pl.Float64)
                               for c, v in cols.items()))
    out.write_csv(args.out)
    skipped = len(records) - len(mine)
    bound = ("" if unc is not None else
             "; no error bounds (the parameter file has no uncertainty: fit it again with `rubick model fit`)")
    print(f"predicted {len(mine)} configurations of {model.name} ({int((~ok).sum())} infeasible)"
          + (f"; {skipped} rows of other models left empty" if skipped else "") + bound + f"; wrote {args.out}")
    return 0


def _numbered_batch(numbered: list[tuple[int, dict[str, Any]]], allow_tp_across_nodes: bool):
    """A batch of table rows, with errors naming each row's number in the file (1 = first data row)."""
    from .configs import ConfigBatch, check_config, config_from_row

    configs = []
    for row, rec in numbered:
        cfg = config_from_row(rec, row)
        check_config(cfg, allow_tp_across_nodes=allow_tp_across_nodes, row=row)
        configs.append(cfg)
    return ConfigBatch.from_configs(configs, allow_tp_across_nodes=allow_tp_across_nodes)


def cmd_validate(args: argparse.Namespace) -> int:
    data = Path(args.data)
    for name in ("fit_points.csv", "throughput_table.csv"):
        if not (data / name).is_file():
            raise CliError(f"{data}: no {name}")
    env = load_env(args.env)
    from replay.progress import enabled, steps

    keys = MODEL_KEYS
    with steps(enabled(args.progress), "model validate", len(keys)) as progress:
        results = []
        for key in keys:  # one model at a time, as `validate` does, so the progress can follow
            progress.step(f"fitting and checking {key}")
            results += validate(data, Path(args.models), env, keys=(key,))
            progress.advance()
    print(f"fitted on {data / 'fit_points.csv'} only; errors on every other measured row of "
          f"throughput_table.csv (environment {env.name})")
    print(format_report(results))
    return 0
