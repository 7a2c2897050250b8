"""`rubick report`: a comparison table of runs, and plots (matplotlib, Agg backend, PNG).

Per run it reads `summary.json` (the table, the JCT CDF) and, for the time plots, the event log
(`events/`). Plots written:

- `jct_cdf.png`: JCT CDF per run;
- `utilisation.png`: GPU utilisation in % (GPUs held / cluster GPUs, as the table's) and queue length
  over time, per run, as time-weighted means over windows (about 80 over the longest run);
- `timeline-<run>.png`: per-job timeline of plans, jobs grouped by model (each group by submission;
  colour = plan family, pale = restarting, grey = waiting, bar height ~ GPUs; past
  `MAX_TIMELINE_ROWS` jobs, every k-th job of each model).

Every title names the trace, the cluster and the policy (or policies); every time axis runs from 0
to the end of the longest run of the report, so the runs' plots line up; legends are outside the
axes. `figures` returns the matplotlib figures, `plot` writes them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from controlplane.eventlog import events as read_events

from .run import EVENTS_DIR, SUMMARY_FILE
from .timeline import JobLine, Timeline, build

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


def run_facts(summary: dict[str, Any]) -> tuple[str, str, str]:
    """(trace, cluster, policy) of a run, as its plots name them: the trace file's name (with the
    scale when repeated), NODESxGPUS with the GPU count, the policy."""
    cfg = summary.get("config") or {}
    trace = Path(str(cfg.get("trace") or "unknown trace")).name
    scale = cfg.get("scale") or 1
    if scale != 1:
        trace += f" x{scale}"
    cluster = str(cfg.get("cluster") or "unknown cluster")
    gpus = summary.get("cluster_gpus")
    if gpus:
        cluster += f" ({gpus} GPUs)"
    return trace, cluster, str(cfg.get("policy") or "unknown policy")


def describe(summaries: Sequence[dict[str, Any]]) -> str:
    """What a figure over several runs shows: trace(s), cluster(s) and policies."""
    facts = [run_facts(s) for s in summaries]

    def one(i: int, word: str, plural: str) -> str:
        values = list(dict.fromkeys(f[i] for f in facts))
        return f"{word} {values[0]}" if len(values) == 1 else f"{plural} {', '.join(values)}"
    return f"{one(0, 'trace', 'traces')}, cluster {', '.join(dict.fromkeys(f[1] for f in facts))}; " \
           f"{one(2, 'policy', 'policies')}"


MAX_TIMELINE_ROWS = 600
"""More jobs than this: a timeline shows every k-th job of each model (said in its title)."""


def _timeline_rows(tl: Timeline) -> tuple[list[tuple[str, list[JobLine]]], int]:
    """The jobs a timeline shows, grouped by model (the models in order of first submission, the jobs
    by submission), and the stride k (1 = every job)."""
    jobs = sorted(tl.jobs.values(), key=lambda j: (j.submitted, j.job_id))
    groups: dict[str, list[JobLine]] = {}
    for job in jobs:
        groups.setdefault(job.model, []).append(job)
    stride = max(1, -(-len(jobs) // MAX_TIMELINE_ROWS))
    return [(model, js[::stride]) for model, js in groups.items()], stride


def _time_span_s(timelines: Sequence[Timeline | None]) -> float:
    """The end of the longest run: every time plot of a report shares the axis 0..this."""
    ends = [0.0]
    for tl in timelines:
        if tl is None:
            continue
        ends.append(tl.end)
        ends.extend(s.end for j in tl.jobs.values() for s in j.segments[-1:])
        ends.extend(t for t, _ in tl.queue[-1:])
    return max(ends)


def _legend_outside(fig: Any, handles: list[Any], title: str | None = None) -> Any:
    return fig.legend(handles=handles, loc="outside right center", fontsize=8, title=title, title_fontsize=8,
                      frameon=False)


def read_timelines(runs: Sequence[Path], warn: Callable[[str], None] = lambda message: None,
                   progress: Any = None) -> list[Timeline | None]:
    """Each run's timeline from its event log (None where there is none); `warn` is told what is left out."""
    timelines: list[Timeline | None] = []
    for run in runs:
        if progress is not None:
            progress.step(f"reading {Path(run).name}'s event log")
        log = Path(run) / EVENTS_DIR
        if not log.is_dir():
            warn(f"{run}: no event log ({EVENTS_DIR}/): left out of the time plots")
            timelines.append(None)
        else:
            decoded = read_events(log)
            for path, why in decoded.problems:
                warn(f"{path}: {why}; the time plots of {run} show the rest of its log")
            if decoded.undecodable:
                seq, subject, why = decoded.undecodable[0]
                warn(f"{log}: {len(decoded.undecodable)} row(s) that are not valid events left out of the time "
                     f"plots (the first: event {seq} on {subject}: {why})")
            timelines.append(build(decoded.events))
        if progress is not None:
            progress.advance()
    return timelines


def figures(runs: Sequence[Path], summaries: Sequence[dict[str, Any]], timelines: Sequence[Timeline | None],
            progress: Any = None) -> dict[str, Any]:
    """The report's figures (matplotlib `Figure`s, no pyplot), by file name. Every title names the
    trace, cluster and policy (or policies); every time axis runs from 0 to the end of the longest
    run, so the runs' plots line up; legends sit outside the axes; utilisation is in %, as in the
    table."""
    import matplotlib.colors as mcolors
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import PercentFormatter

    labels = run_labels(runs)
    what = describe(summaries)
    span_h = _time_span_s(timelines) / 3600 or 1.0
    out: dict[str, Any] = {}

    def step(name: str) -> None:
        if progress is not None:
            progress.step(f"drawing {name}")

    step("jct_cdf.png")
    fig = Figure(figsize=(9, 4.8), layout="constrained")
    ax = fig.add_subplot()
    handles = []
    for label, s in zip(labels, summaries):
        jct = np.sort([j["jct_s"] / 3600 for j in s["per_job"] if j["jct_s"] is not None])
        if len(jct):
            avg = s["jct"]["avg_h"] or 0.0
            handles += ax.step(jct, np.arange(1, len(jct) + 1) / len(jct) * 100, where="post",
                               label=f"{label} (avg {avg:.2f} h)")
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("jobs completed within (%)")
    ax.yaxis.set_major_formatter(PercentFormatter(100))
    ax.set_ylim(0, 101)
    ax.grid(alpha=0.3)
    fig.suptitle(f"JCT CDF: {what}", fontsize=10)
    if handles:
        _legend_outside(fig, handles)
    out["jct_cdf.png"] = fig
    if progress is not None:
        progress.advance()

    step("utilisation.png")
    fig = Figure(figsize=(10, 6), layout="constrained")
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    series = []
    for label, tl, s in zip(labels, timelines, summaries):
        if tl is None or not tl.total_gpus:
            continue
        t, held = held_series(tl)
        q = np.array(tl.queue, dtype=np.float64).reshape(-1, 2)
        series.append((label, t, held / tl.total_gpus * 100, q, s.get("gpu_utilisation")))
    width = _window(span_h * 3600)
    handles = []
    for k, (label, t, util, q, mean) in enumerate(series):  # time-weighted means per window: every step is a blur
        colour = f"C{k % 10}"
        if len(t):
            edges, means = window_means(t, util, width, t[-1])
            ax1.stairs(means, edges / 3600, lw=1.2, color=colour, baseline=None)
        if len(q):
            edges, means = window_means(q[:, 0], q[:, 1], width, q[-1, 0])
            ax2.stairs(means, edges / 3600, lw=1.2, color=colour, baseline=None)
        handles.append(Line2D([], [], color=colour, lw=1.5,
                              label=label + (f" (run mean {mean:.1%})" if isinstance(mean, (int, float)) else "")))
    fig.suptitle(f"GPU utilisation and jobs waiting: {what}\n(time-weighted mean per {_duration(width)})",
                 fontsize=10)
    ax1.set_ylabel("GPU utilisation (% held)")
    ax1.yaxis.set_major_formatter(PercentFormatter(100))
    ax1.set_ylim(0, 105)
    ax1.grid(alpha=0.3)
    if handles:
        _legend_outside(fig, handles)
    else:
        ax1.text(0.5, 0.5, "no event log could be read", ha="center", va="center", transform=ax1.transAxes)
    ax2.set_ylabel("jobs waiting")
    ax2.set_xlabel("time (hours)")
    ax2.set_xlim(0, span_h)
    ax2.grid(alpha=0.3)
    out["utilisation.png"] = fig
    if progress is not None:
        progress.advance()

    fam_handles = [Patch(color=c, label=fam) for fam, c in FAMILY_COLOURS.items()]
    fam_handles += [Patch(color=mcolors.to_rgba("0.4", 0.3), label="restarting (pale)"),
                    Patch(color="0.85", label="waiting (no GPUs)")]
    for label, tl, s in zip(labels, timelines, summaries):
        if tl is None or not tl.jobs:
            continue  # nothing read (named above): no empty timeline
        name = f"timeline-{label}.png"
        step(name)
        groups, stride = _timeline_rows(tl)
        rows = sum(len(js) for _, js in groups)
        max_gpus = max((seg.gpus for _, js in groups for j in js for seg in j.segments), default=1) or 1
        fig = Figure(figsize=(11, min(12.0, max(4.5, 2.0 + rows * 0.02))), layout="constrained")
        ax = fig.add_subplot()
        bars, colours, waits = [], [], []
        row, ticks, ticklabels = 0, [], []
        for model, js in groups:
            first = row
            for job in js:
                start = job.segments[0].start if job.segments else (job.end if job.end is not None else tl.end)
                if start > job.submitted:
                    waits.append(_rect(job.submitted / 3600, start / 3600, row, 0.5))
                for seg in job.segments:
                    bars.append(_rect(seg.start / 3600, seg.end / 3600, row, 0.6 + 0.35 * min(1.0, seg.gpus / max_gpus)))
                    colours.append(mcolors.to_rgba(FAMILY_COLOURS[_plan_family(seg.plan)],
                                                   1.0 if seg.state == "run" else 0.3))
                row += 1
            ticks.append((first + row - 1) / 2)
            ticklabels.append(f"{model} ({len(js)})")
            if row < rows:
                ax.axhline(row - 0.5, color="0.5", lw=0.6)
        ax.add_collection(PolyCollection(waits, facecolors="0.85", edgecolors="none"))
        ax.add_collection(PolyCollection(bars, facecolors=colours, edgecolors="none"))
        ax.set_xlim(0, span_h)
        ax.set_ylim(rows - 0.5, -0.5)
        ax.set_yticks(ticks, ticklabels, fontsize=8)
        ax.tick_params(axis="y", length=0)
        ax.set_xlabel("time (hours)")
        ax.set_ylabel("jobs by model, each by submission")
        ax.grid(axis="x", alpha=0.3)
        trace, cluster, policy = run_facts(s)
        shown = f"{rows} jobs" if stride == 1 else f"one job in {stride} of each model: {rows} of {len(tl.jobs)}"
        fig.suptitle(f"Plan per job over time: policy {policy}{f' ({label})' if label != policy else ''}, trace {trace}, "
                     f"cluster {cluster}\n"
                     f"{shown}; bar height ~ GPUs held (up to {max_gpus})", fontsize=10)
        _legend_outside(fig, fam_handles, title="plan")
        out[name] = fig
        if progress is not None:
            progress.advance()
    return out


def _rect(x0: float, x1: float, row: int, height: float) -> list[tuple[float, float]]:
    h = height / 2
    return [(x0, row - h), (x0, row + h), (x1, row + h), (x1, row - h)]


def plot_steps(runs: Sequence[Path]) -> int:
    """The steps `plot` reports to its progress: each log read, each figure drawn, each file written."""
    return len(runs) + 2 * (2 + len(runs))


def plot(runs: Sequence[Path], summaries: Sequence[dict[str, Any]], out: Path,
         warn: Callable[[str], None] = lambda message: None, progress: Any = None) -> list[Path]:
    """Write the plots to `out`; `warn` is told what the time plots leave out (a run without an event
    log, a log file that cannot be read, rows that are not valid events). `progress` (a
    `replay.progress.StepProgress`, display only) is told each step."""
    out.mkdir(parents=True, exist_ok=True)
    timelines = read_timelines(runs, warn, progress)
    written = []
    for name, fig in figures(runs, summaries, timelines, progress).items():
        if progress is not None:
            progress.step(f"writing {name}")
        written.append(out / name)
        fig.savefig(written[-1], dpi=110)
        if progress is not None:
            progress.advance()
    return written
