"""`rubick report`: a comparison table of runs, and plots (matplotlib, Agg backend, PNG).

Per run it reads `summary.json` (the table, the JCT CDF) and, for the time plots, the event log
(`events/`). Plots written:

- `jct_cdf.png`: JCT CDF per run;
- `utilisation.png`: GPU utilisation (GPUs held / cluster GPUs) and queue length over time, per run,
  as time-weighted means over windows (about 80 over the longest run);
- `timeline-<run>.png`: per-job timeline of plans (one row per job by submission; colour = plan,
  pale = restarting).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from controlplane.eventlog import events as read_events

from .run import EVENTS_DIR, SUMMARY_FILE
from .timeline import Timeline, build

COLUMNS = (("run", "{}"), ("policy", "{}"), ("done", "{}"), ("avg JCT h", "{:.2f}"), ("P99 JCT h", "{:.2f}"),
           ("makespan h", "{:.2f}"), ("guar. avg h", "{}"), ("b-e avg h", "{}"), ("SLO viol.", "{}"),
           ("in quota", "{}"),
           ("GPU util", "{:.1%}"), ("reconfigs", "{}"), ("restart cost h", "{:.2f}"), ("fallbacks", "{}"))


def run_labels(runs: Sequence[Path]) -> list[str]:
    """Folder names, or parent/name where two runs share a name."""
    names = [Path(r).name for r in runs]
    if len(set(names)) == len(names):
        return names
    return [f"{Path(r).parent.name}-{Path(r).name}" for r in runs]


PLOT_FILES = ("jct_cdf.png", "utilisation.png")


def expand_runs(paths: Sequence[Path], warn: Callable[[str], None]) -> list[Path]:
    """The run folders among `paths`: a folder with `summary.json` is a run; one without it stands for
    the runs directly inside it (what `rubick simulate --policies` writes: one folder per policy).
    A folder of plots a report wrote (it holds `jct_cdf.png` and no run) is passed over; anything
    else is named in a warning and left out."""
    runs: list[Path] = []
    for path in map(Path, paths):
        if (path / SUMMARY_FILE).is_file():
            runs.append(path)
            continue
        inside = sorted(p for p in path.iterdir() if (p / SUMMARY_FILE).is_file()) if path.is_dir() else []
        if inside:
            runs.extend(inside)
        elif not (path / PLOT_FILES[0]).is_file():
            what = "no such folder" if not path.exists() else f"no {SUMMARY_FILE} in it or in its folders"
            warn(f"{path}: {what}; left out")
    return runs


def default_out(runs: Sequence[Path]) -> Path:
    """`report/` in the deepest folder holding every run's folder (`runs/report` for `runs/*`)."""
    try:
        return Path(os.path.commonpath([Path(r).parent for r in runs])) / "report"
    except ValueError:  # absolute and relative paths mixed
        return Path(runs[0]).parent / "report"


def load_summary(run: Path) -> dict[str, Any]:
    return json.loads((Path(run) / SUMMARY_FILE).read_text())


def _h(stats: dict[str, Any]) -> str:
    return "-" if not stats.get("n") else f"{stats['avg_h']:.2f}"


def table_rows(runs: Sequence[Path], summaries: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for label, s in zip(run_labels(runs), summaries):
        j = s["jobs"]
        values = [label, s["config"]["policy"], f"{j['completed']}/{j['submitted']}",
                  s["jct"]["avg_h"] or 0.0, s["jct"]["p99_h"] or 0.0, s["makespan_h"], _h(s["guaranteed"]),
                  _h(s["best_effort"]), s["slo_violations"],
                  s.get("slo_violations_within_quota", "-"), s["gpu_utilisation"], s["reconfigurations"],
                  s["restarts"]["total_cost_s"] / 3600, s["fallback_to_model"]["lookups"]]
        rows.append([fmt.format(v) for (_, fmt), v in zip(COLUMNS, values)])
    return rows


def format_table(rows: list[list[str]]) -> str:
    head = [c for c, _ in COLUMNS]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def held_series(tl: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """(times, GPUs held) as a step function."""
    changes: dict[float, int] = {}
    for job in tl.jobs.values():
        for s in job.segments:
            changes[s.start] = changes.get(s.start, 0) + s.gpus
            changes[s.end] = changes.get(s.end, 0) - s.gpus
    times = np.array(sorted(changes), dtype=np.float64)
    held = np.cumsum([changes[t] for t in sorted(changes)]) if changes else np.array([])
    return times, held


def window_means(times: np.ndarray, values: np.ndarray, width: float, end: float) -> tuple[np.ndarray, np.ndarray]:
    """(edges, means): the time-weighted mean of a step function (`values[i]` from `times[i]` to the next
    time, 0 before the first) over windows of `width` seconds from 0 to `end` (the last one may be
    shorter)."""
    edges = np.append(np.arange(0.0, end, width), end)
    t, v = np.asarray(times, dtype=np.float64), np.asarray(values, dtype=np.float64)
    if not len(t):
        return edges, np.zeros(len(edges) - 1)
    area = np.concatenate([[0.0], np.cumsum(v[:-1] * np.diff(t))])  # the integral up to each step
    k = np.searchsorted(t, edges, side="right") - 1
    at = np.maximum(k, 0)
    integral = np.where(k >= 0, area[at] + v[at] * (edges - t[at]), 0.0)
    return edges, np.diff(integral) / np.diff(edges)


WINDOWS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400)


def _window(span_s: float, count: int = 80) -> float:
    """A round window length giving about `count` windows over `span_s`."""
    return float(next((w for w in WINDOWS_S if w >= span_s / count), WINDOWS_S[-1]))


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def _plan_family(code: str) -> str:
    if "-tp1-pp1-" not in code:
        return "3D (TP/PP)"
    if "-off" in code:
        return "ZeRO-Offload"
    if "-z2" in code or "-z1" in code or "-z3" in code:
        return "ZeRO-DP"
    return "DP+GC" if code.endswith("-gc") or "-gc-" in code else "DP"


FAMILY_COLOURS = {"DP": "tab:blue", "DP+GC": "tab:cyan", "ZeRO-DP": "tab:green", "ZeRO-Offload": "tab:orange",
                  "3D (TP/PP)": "tab:red"}


def plot(runs: Sequence[Path], summaries: Sequence[dict[str, Any]], out: Path,
         warn: Callable[[str], None] = lambda message: None) -> list[Path]:
    """Write the plots to `out`; `warn` is told what the time plots leave out (a run without an event
    log, a log file that cannot be read, rows that are not valid events)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    out.mkdir(parents=True, exist_ok=True)
    written = []
    labels = run_labels(runs)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, s in zip(labels, summaries):
        jct = np.sort([j["jct_s"] / 3600 for j in s["per_job"] if j["jct_s"] is not None])
        if len(jct):
            ax.step(jct, np.arange(1, len(jct) + 1) / len(jct), where="post", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out / "jct_cdf.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    timelines = []
    for run in runs:
        log = Path(run) / EVENTS_DIR
        if not log.is_dir():
            warn(f"{run}: no event log ({EVENTS_DIR}/): left out of the time plots")
            timelines.append(None)
            continue
        decoded = read_events(log)
        for path, why in decoded.problems:
            warn(f"{path}: {why}; the time plots of {run} show the rest of its log")
        if decoded.undecodable:
            seq, subject, why = decoded.undecodable[0]
            warn(f"{log}: {len(decoded.undecodable)} row(s) that are not valid events left out of the time plots "
                 f"(the first: event {seq} on {subject}: {why})")
        timelines.append(build(decoded.events))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    series = []
    for label, tl in zip(labels, timelines):
        if tl is None or not tl.total_gpus:
            continue
        t, held = held_series(tl)
        q = np.array(tl.queue, dtype=np.float64).reshape(-1, 2)
        series.append((label, t, held / tl.total_gpus, q))
    span = max((max(t[-1] if len(t) else 0.0, q[-1, 0] if len(q) else 0.0) for _, t, _, q in series), default=0.0)
    width = _window(span)
    for label, t, util, q in series:  # every step of a day's run is a blur: time-weighted means per window
        if len(t):
            edges, means = window_means(t, util, width, t[-1])
            ax1.stairs(means, edges / 3600, label=label, lw=1.2)
        if len(q):
            edges, means = window_means(q[:, 0], q[:, 1], width, q[-1, 0])
            ax2.stairs(means, edges / 3600, label=label, lw=1.2)
    ax1.set_title(f"GPU utilisation and jobs waiting: time-weighted mean per {_duration(width)}", fontsize=10)
    ax1.set_ylabel("GPU utilisation (held)")
    ax1.grid(alpha=0.3)
    if series:
        ax1.legend(fontsize=8)
    else:
        ax1.text(0.5, 0.5, "no event log could be read", ha="center", va="center", transform=ax1.transAxes)
    ax2.set_ylabel("jobs waiting")
    ax2.set_xlabel("time (hours)")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    written.append(out / "utilisation.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    for label, tl in zip(labels, timelines):
        if tl is None or not tl.jobs:
            continue  # nothing read (named above): no empty timeline
        jobs = sorted(tl.jobs.values(), key=lambda j: (j.submitted, j.job_id))
        fig, ax = plt.subplots(figsize=(11, max(4.0, min(40.0, len(jobs) * 0.03))))
        lines, colours, widths = [], [], []
        for row, job in enumerate(jobs):
            for s in job.segments:
                lines.append([(s.start / 3600, row), (s.end / 3600, row)])
                colour = matplotlib.colors.to_rgba(FAMILY_COLOURS[_plan_family(s.plan)],
                                                   1.0 if s.state == "run" else 0.3)
                colours.append(colour)
                widths.append(max(0.5, min(4.0, s.gpus / 8)))
        ax.add_collection(LineCollection(lines, colors=colours, linewidths=widths))
        ax.autoscale()
        ax.invert_yaxis()
        ax.set_xlabel("time (hours)")
        ax.set_ylabel("job (by submission)")
        ax.set_title(f"{label}: plan per job over time (pale = restarting, width ~ GPUs)")
        for fam, c in FAMILY_COLOURS.items():
            ax.plot([], [], color=c, label=fam)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        written.append(out / f"timeline-{label}.png")
        fig.savefig(written[-1], dpi=100)
        plt.close(fig)
    return written
