"""`rubick simulate`, `rubick report` and `rubick replay` (see docs/simulate.md)."""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import signal
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

from controlplane.cli.common import fail
from controlplane.events.payloads import DEFAULT_REFIT_BACKOFF, MAX_REFIT_BACKOFF, NETWORK_SETTINGS

from .progress import add_flag as add_progress_flag, enabled as progress_enabled

LAYOUTS = ("auto", "artifact", "pai")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate a trace on a virtual cluster with the real cores",
                       description="Run a trace through the admission, modeler and policy cores and simulated node "
                                   "agents on a virtual clock; write the Parquet event log and summary.json.")
    p.add_argument("--trace", type=Path, required=True, help="trace file (artifact workload CSV or PAI task table)")
    p.add_argument("--layout", choices=LAYOUTS, default="auto", help="trace layout (default: from the header)")
    p.add_argument("--cluster", default="8x8", help="NODESxGPUS, e.g. 8x8 (default) or 80x8")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--policy", help="policy name (see policy.registry)")
    group.add_argument("--policies", help="comma-separated policy names, or 'all'; one run per policy in OUT/<name>")
    p.add_argument("--out", type=Path, required=True, help="run folder (events/, summary.json)")
    p.add_argument("--restart-cost", type=float, help="seconds a reconfiguration costs (default 78)")
    p.add_argument("--start-cost", type=float,
                   help="seconds a job's first launch takes before it makes progress (default 0)")
    p.add_argument("--artifact-costs", action="store_true",
                   help="the cost model of the paper's own simulator: 260 s for every placement change, the "
                        "first start included (sets --start-cost and --restart-cost to 260 unless given)")
    p.add_argument("--quotas", type=Path, help="YAML/JSON mapping tenant -> GPUs for guaranteed jobs "
                                               "(default: the whole cluster for every tenant)")
    p.add_argument("--seed", type=int, default=0, help="seed of the agents' measurement noise (default 0)")
    p.add_argument("--oracle", choices=("model", "table"), default="model",
                   help="what the policy believes about iteration times: the fitted model (default) or the table")
    p.add_argument("--tick", type=float, default=60.0, help="clock.tick period in seconds (default 60)")
    p.add_argument("--batch", type=float, default=60.0,
                   help="seconds a best-effort submission may wait for the next round when no GPU is free, so a "
                        "burst costs one round (default 60; 0 = a round on every submission)")
    p.add_argument("--hold", type=float,
                   help="seconds a job just changed keeps its allocation against best-effort reasons, so short jobs "
                        "cannot restart a long one over and over (default: twice the restart cost; 0 = none)")
    p.add_argument("--hold-backoff", type=float, default=3600.0,
                   help="seconds within which each change of a job doubles its hold (at most 16 times), so a job "
                        "shrunk and grown back again and again is left alone longer (default 3600; 0 = none)")
    p.add_argument("--refit-backoff", type=int, default=DEFAULT_REFIT_BACKOFF, metavar="N",
                   help="a model type whose last k refits in a row published nothing waits for 5 * 2^min(k, N) "
                        "measurements before its next refit, so a model that cannot follow a type is not fitted "
                        f"again every few measurements (0 to {MAX_REFIT_BACKOFF}; default {DEFAULT_REFIT_BACKOFF}; "
                        "0 = 5 every time)")
    p.add_argument("--sample-every", type=float, default=600.0,
                   help="seconds between a running job's metrics.iteration samples (default 600)")
    p.add_argument("--noise", type=float, default=0.0, help="log-normal sigma of measured iteration times (default 0)")
    p.add_argument("--scale", type=int, default=1, help="repeat the trace N times (see docs/simulate.md)")
    p.add_argument("--pai-job-table", type=Path, default=None, metavar="FILE",
                   help="pai layout: the trace's pai_job_table.csv, joined by job name for each job's user and "
                        "submission time")
    p.add_argument("--on-bad", choices=("refuse", "skip"), default="refuse",
                   help="a bad trace line refuses the file (default) or is skipped and counted")
    p.add_argument("--max-time-h", type=float, default=720.0, help="stop the simulation at this virtual hour")
    p.add_argument("--no-fit-cache", action="store_true", help="fit the model parameters again, do not cache them")
    p.add_argument("--network", choices=NETWORK_SETTINGS, default="none",
                   help="simulate the network between nodes and schedule the jobs' flows (docs/network.md): none "
                        "(default: jobs never slow each other down), fair sharing, Coflow or EchelonFlow classes")
    p.add_argument("--network-classes", type=int, default=4, help="traffic classes the fabric offers (1-8, default 4)")
    p.add_argument("--rack-size", type=int, default=0,
                   help="nodes per rack behind an oversubscribed core (default 0: one non-blocking tier)")
    p.add_argument("--oversubscription", type=float, default=1.0,
                   help="rack uplink = the rack's NIC capacity / this (default 1)")
    add_progress_flag(p)
    p.set_defaults(func=cmd_simulate)

    r = sub.add_parser("report", help="compare simulated runs: table and plots")
    r.add_argument("runs", nargs="+", type=Path,
                   help="run folders (with summary.json), or folders of runs (simulate --policies)")
    r.add_argument("--out", type=Path, help="folder for the plots (default: report/ in the folder holding all the runs)")
    r.add_argument("--no-plots", action="store_true", help="print the table only")
    add_progress_flag(r)
    r.set_defaults(func=cmd_report)

    v = sub.add_parser("replay", help="check a recorded run's decisions byte for byte, or replay it as a what-if",
                       description="Without --policy: feed the recorded inputs to the same cores and check every "
                                   "plan.decided. With --policy/--restart-cost and --out: simulate the recorded day "
                                   "again with those changes.")
    v.add_argument("log", type=Path, help="the run's event-log folder (<run>/events; the run folder will do)")
    v.add_argument("--policy", help="what-if: another policy")
    v.add_argument("--restart-cost", type=float, help="what-if: another restart cost (s)")
    v.add_argument("--out", type=Path, help="what-if: folder of the new run")
    v.add_argument("--only", help="comma-separated cores to rebuild (admission, modeler, policy, and network where the run had one; default all); "
                                  "the others' recorded answers become inputs")
    v.add_argument("--context", type=int, default=5, help="events shown before a divergence (default 5)")
    v.add_argument("--jobs", type=int, help="processes checking the cores side by side (default: one per CPU, "
                                            "at most one per core; 1 checks them all in this process)")
    add_progress_flag(v)
    v.set_defaults(func=cmd_replay)


def _policies(args: argparse.Namespace) -> list[str]:
    from .config import policy_names

    if args.policy:
        return [args.policy]
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    if names == ["all"]:
        names = list(policy_names())
    return names


SIMULATE_NUMBERS = (  # option, least value, whether the least value itself is allowed, unit
    ("--restart-cost", 0.0, True, "seconds"), ("--start-cost", 0.0, True, "seconds"), ("--tick", 0.0, False, "seconds"),
    ("--batch", 0.0, True, "seconds"), ("--hold", 0.0, True, "seconds"), ("--hold-backoff", 0.0, True, "seconds"),
    ("--sample-every", 0.0, False, "seconds"),
    ("--noise", 0.0, True, "(a log-normal sigma)"), ("--max-time-h", 0.0, False, "hours"), ("--seed", 0, True, ""),
    ("--scale", 1, True, "(copies of the trace)"), ("--network-classes", 1, True, "(traffic classes)"),
    ("--rack-size", 0, True, "(nodes)"), ("--oversubscription", 1.0, True, "(a ratio)"),
)
REPLAY_NUMBERS = (("--restart-cost", 0.0, True, "seconds"), ("--context", 0, True, "events"),
                  ("--jobs", 1, True, "processes"))


def bad_number(args: argparse.Namespace, rules) -> str | None:
    """The first option given with a value out of its range (or not finite), as a message; else None."""
    for option, least, inclusive, unit in rules:
        value = getattr(args, option[2:].replace("-", "_"))
        if value is None:
            continue
        if not math.isfinite(value) or value < least or (value == least and not inclusive):
            kind = "a finite number " if isinstance(value, float) else ""
            return f"{option} must be {kind}{'>=' if inclusive else '>'} {least:g}{' ' + unit if unit else ''}, got {value!r}"
    return None


def bad_out(path: Path | None) -> str | None:
    """Why `path` cannot be an output folder (a file is in the way, or the nearest existing folder
    above it cannot be written), as a message; else None. Checked before any work is done."""
    if path is None:
        return None
    if path.exists() and not path.is_dir():
        return f"--out {path}: exists and is not a folder"
    above = path
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        return f"--out {path}: {above} is not a folder"
    if not os.access(above, os.W_OK | os.X_OK):
        return f"--out {path}: {above} cannot be written"
    return None


ARTIFACT_COST_S = 260.0
"""The paper's simulator charges this on every placement change, the first start included."""


def cmd_simulate(args: argparse.Namespace) -> int:
    from .stopping import before

    with before():  # a time limit that comes while the trace is read still gets the run written, with nothing in it
        return _simulate(args)


def _simulate(args: argparse.Namespace) -> int:
    from .config import RunConfig, default_cache_dir, load_parts, parse_cluster, policy_names
    from .importers import read_trace
    from .run import simulate, trace_inputs
    from .trace import TraceError, scale_trace

    from controlplane.cli.service import read_quotas

    try:
        parse_cluster(args.cluster)
        quotas = read_quotas(args.quotas)
    except (OSError, ValueError) as exc:
        return fail(str(exc))
    problem = bad_number(args, SIMULATE_NUMBERS)
    if problem:
        return fail(problem)
    if args.network_classes > 8:
        return fail(f"--network-classes must be 1 to 8, got {args.network_classes}")
    if not 0 <= args.refit_backoff <= MAX_REFIT_BACKOFF:
        return fail(f"--refit-backoff must be 0 to {MAX_REFIT_BACKOFF}, got {args.refit_backoff}")
    if args.network == "none" and (args.rack_size or args.oversubscription != 1.0 or args.network_classes != 4):
        return fail("--network-classes, --rack-size and --oversubscription describe a network: give --network too")
    default_cost = ARTIFACT_COST_S if args.artifact_costs else None
    restart_cost = args.restart_cost if args.restart_cost is not None else (default_cost or 78.0)
    start_cost = args.start_cost if args.start_cost is not None else (default_cost or 0.0)
    names = _policies(args)
    known = policy_names()
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        return fail(f"unknown policy {', '.join(unknown) or '(none)'}; known: {', '.join(known) or 'none (policy.registry not importable)'}")
    for out_dir in [args.out] + ([args.out / n for n in names] if len(names) > 1 else []):
        problem = bad_out(out_dir)
        if problem:
            return fail(problem)
    parts = load_parts(cache_dir=None if args.no_fit_cache else default_cache_dir())
    table = parts.table

    def iter_time(model, plan, gpus):
        t = table.iter_time(model, plan, (gpus,))
        return t if t is not None and t != float("inf") else None

    try:
        trace = read_trace(args.trace, parts.batches, layout=args.layout, on_bad=args.on_bad, iter_time=iter_time,
                           jobs_table=args.pai_job_table)
    except TraceError as exc:
        print(f"rubick: trace refused: {exc}", file=sys.stderr)
        if exc.skippable:
            print("(use --on-bad skip to leave bad lines out)", file=sys.stderr)
        return 2
    except ValueError as exc:  # a job table with another layout
        return fail(str(exc))
    for problem in trace.skipped:
        print(f"skipped {problem}", file=sys.stderr)
    if trace.skipped:
        print(f"{len(trace.skipped)} bad line(s) skipped", file=sys.stderr)
    if trace.filtered:
        reasons = Counter(p.reason.removeprefix("filtered: ") for p in trace.filtered)
        print(f"{len(trace.filtered)} line(s) not replayed by the {trace.layout} layout's rules: "
              + "; ".join(f"{n} {why}" for why, n in reasons.most_common()), file=sys.stderr)
    if trace.capped:
        print(f"{len(trace.capped)} job(s) replayed with fewer GPUs than they asked for "
              f"(e.g. line {trace.capped[0].line}: {trace.capped[0].reason.removeprefix('capped: ')})", file=sys.stderr)
    if not trace.jobs:
        return fail(f"no job to replay in {args.trace}: {len(trace.skipped)} bad line(s) skipped, "
                    f"{len(trace.filtered)} line(s) not replayed by the {trace.layout} layout's rules")
    jobs = scale_trace(trace.jobs, args.scale)
    late = sum(1 for j in jobs if j.submit_s > args.max_time_h * 3600)
    if late:
        print(f"{late} job(s) arrive after --max-time-h {args.max_time_h:g} h and are not submitted "
              f"(the last at {max(j.submit_s for j in jobs) / 3600:.1f} h): raise --max-time-h to replay them",
              file=sys.stderr)
    base = RunConfig(policy=names[0], cluster=args.cluster, restart_cost_s=restart_cost,
                     start_cost_s=start_cost, seed=args.seed, quotas=quotas,
                     oracle=args.oracle, tick_period_s=args.tick, sample_every_s=args.sample_every, noise=args.noise,
                     max_time_s=args.max_time_h * 3600, trace=str(args.trace),
                     trace_sha256=hashlib.sha256(args.trace.read_bytes()).hexdigest(), trace_layout=trace.layout,
                     scale=args.scale, on_bad=args.on_bad, batch_s=args.batch,
                     hold_s=args.hold, hold_backoff_s=args.hold_backoff, refit_backoff=args.refit_backoff,
                     network=args.network, network_classes=args.network_classes,
                     rack_size=args.rack_size, oversubscription=args.oversubscription)
    from .progress import sim as sim_progress

    show = progress_enabled(args.progress)
    from .stopping import interrupted, kept
    interrupted.clear()
    for k, name in enumerate(names, 1):
        cfg = replace(base, policy=name)
        out_dir = args.out if len(names) == 1 else args.out / name
        inputs = trace_inputs(cfg, jobs, parts)
        label = f"{name} on {args.cluster}" + (f" ({k}/{len(names)})" if len(names) > 1 else "")
        with sim_progress(show, label, sum(1 for e in inputs if e.base == "job.submitted")) as progress:
            out = simulate(cfg, inputs, parts, out_dir=out_dir, progress=progress if show else None,
                           extra={"trace_skipped": len(trace.skipped), "trace_filtered": len(trace.filtered),
                                  "trace_capped": len(trace.capped), "trace_after_max_time": late})
        _print_run(out_dir, out)
        if interrupted:
            print(f"rubick: stopped by {signal.Signals(interrupted[0]).name}: {out_dir} holds what was simulated "
                  "until then", file=sys.stderr)
            return 128 + interrupted[0]
    late = kept()
    if late is not None:  # it came while the last run was written: that run is whole
        print(f"rubick: stopped by {signal.Signals(late).name} after {args.out} was written", file=sys.stderr)
        return 128 + late
    return 0


def _print_run(out_dir: Path, out) -> None:
    s, r = out.summary, out.result
    split = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r.core_seconds.items()))
    print(f"{out_dir}: {s['config']['policy']}: {s['jobs']['completed']}/{s['jobs']['submitted']} jobs done, "
          f"avg JCT {s['jct']['avg_h'] or 0:.2f} h, P99 {s['jct']['p99_h'] or 0:.2f} h, "
          f"makespan {s['makespan_h']:.2f} h, SLO violations {s['slo_violations']}, "
          f"GPU util {s['gpu_utilisation']:.1%}, reconfigurations {s['reconfigurations']}, "
          f"fallbacks to the model {s['fallback_to_model']['lookups']} ({s['stop_reason']})")
    print(f"  {len(r.events)} events in {r.wall_s:.2f} s ({len(r.events) / max(r.wall_s, 1e-9):,.0f} events/s; "
          f"{split}; writing {out.write_s:.2f} s)")


def cmd_report(args: argparse.Namespace) -> int:
    from .report import default_out, expand_runs, format_table, load_summary, plot, table_rows

    problem = None if args.no_plots else bad_out(args.out)
    if problem:
        return fail(problem)
    runs, summaries = [], []
    for run in expand_runs(args.runs, warn=lambda message: print(f"rubick: {message}", file=sys.stderr)):
        try:
            summaries.append(load_summary(run))
            runs.append(run)
        except (OSError, ValueError) as exc:
            print(f"rubick: {run}: no readable summary.json ({exc}); left out", file=sys.stderr)
    if not runs:
        return fail("no run to report")
    print(format_table(table_rows(runs, summaries)))
    if not args.no_plots:
        out = args.out or default_out(runs)
        problem = None if args.out else bad_out(out)  # a given --out was checked before anything was read
        if problem:
            return fail(f"{problem} (the default; choose another with --out)")
        from .progress import steps
        from .report import plot_steps

        with steps(progress_enabled(args.progress), f"report of {len(runs)} run(s)", plot_steps(runs)) as progress:
            written = plot(runs, summaries, out, warn=lambda message: print(f"warning: {message}", file=sys.stderr),
                           progress=progress)
        for path in written:
            print(f"wrote {path}")
    return 0


def _recorded_jobs(log: Path) -> int:
    """Jobs the run beside `log` (its summary.json) submitted, for a what-if's progress; 0 if unknown
    (the progress then counts the submissions as they come)."""
    from .report import load_summary

    try:
        return int(load_summary(log.parent)["jobs"]["submitted"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from .config import RUN_FILE
    from .run import EVENTS_DIR
    from .verify import format_result, verify

    problem = bad_number(args, REPLAY_NUMBERS)
    if problem:
        return fail(problem)
    if not args.log.is_dir():
        return fail(f"no event-log folder at {args.log}")
    if not (args.log / RUN_FILE).exists() and (args.log / EVENTS_DIR / RUN_FILE).exists():
        args.log = args.log / EVENTS_DIR  # a run folder given for its log
    if args.policy or args.restart_cost is not None:
        from .config import policy_names
        from .whatif import what_if

        if args.out is None:
            return fail("a what-if needs --out for the new run")
        problem = bad_out(args.out)
        if problem:
            return fail(problem)
        if args.policy and args.policy not in policy_names():
            return fail(f"unknown policy {args.policy}; known: {', '.join(policy_names()) or 'none'}")
        from .progress import sim as sim_progress

        show = progress_enabled(args.progress)
        try:
            with sim_progress(show, f"what-if {args.policy or 'same policy'}", _recorded_jobs(args.log)):
                out, problems = what_if(args.log, args.out, policy=args.policy, restart_cost_s=args.restart_cost)
        except ValueError as exc:
            return fail(str(exc))
        for p in problems:
            print(f"problem: {p}", file=sys.stderr)
        _print_run(args.out, out)
        return 0 if not problems else 2
    only = tuple(n.strip() for n in args.only.split(",") if n.strip()) if args.only else None
    from .progress import replay as replay_progress

    show = progress_enabled(args.progress)
    try:
        with replay_progress(show, f"replay check of {args.log}") as progress:
            result = verify(args.log, context=args.context, only=only, jobs=args.jobs,
                            progress=progress if show else None)
    except ValueError as exc:
        return fail(str(exc))
    print(format_result(result, args.log))
    if result.divergence is not None and not result.problems:
        return 1
    return 0 if result.ok else 2  # a difference in a log with problems may come from them: 2, not 1
