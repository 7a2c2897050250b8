"""`rubick report`'s figures as a paper's reader would check them: titles naming the trace, cluster and
policy; one time axis for every policy; legends outside the plot area; utilisation in %; a timeline
that stays readable with many jobs."""

from __future__ import annotations

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.ticker import PercentFormatter

from controlplane.cli import main
from replay import report
from replay.report import figures, load_summary, read_timelines

from .conftest import trace_slice


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plots")
    trace = trace_slice(tmp, "workload-mt.csv", rows=25, start=20)
    out = tmp / "runs"
    assert main(["simulate", "--trace", str(trace), "--cluster", "8x8", "--policies", "rubick,antman",
                 "--out", str(out)]) == 0
    assert main(["report", str(out), "--out", str(tmp / "rep")]) == 0
    paths = [out / "antman", out / "rubick"]
    return tmp, paths, [load_summary(p) for p in paths]


def _legend_outside(fig) -> None:
    FigureCanvasAgg(fig).draw()
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert legends, "no legend"
    for legend in legends:
        box = legend.get_window_extent()
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent()), "legend over the plot area"


def test_report_figures(runs):
    tmp, paths, summaries = runs
    for png in ("jct_cdf.png", "utilisation.png", "timeline-rubick.png", "timeline-antman.png"):
        assert (tmp / "rep" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert summaries[0]["makespan_s"] != summaries[1]["makespan_s"]  # else a shared axis proves nothing
    timelines = read_timelines(paths)
    figs = figures(paths, summaries, timelines)
    assert set(figs) == {"jct_cdf.png", "utilisation.png", "timeline-antman.png", "timeline-rubick.png"}
    trace = "slice-workload-mt.csv"
    for name in ("jct_cdf.png", "utilisation.png"):
        title = figs[name]._suptitle.get_text()
        assert trace in title and "8x8 (64 GPUs)" in title and "antman" in title and "rubick" in title, title
    for policy in ("antman", "rubick"):
        title = figs[f"timeline-{policy}.png"]._suptitle.get_text()
        assert f"policy {policy}" in title and trace in title and "cluster 8x8 (64 GPUs)" in title, title
        assert "25 jobs" in title
    # one time axis for all: the utilisation panels and every policy's timeline, 0 to the longest run
    longest_h = max(tl.end for tl in timelines) / 3600
    xlims = [ax.get_xlim() for name in ("utilisation.png", "timeline-antman.png", "timeline-rubick.png")
             for ax in figs[name].axes]
    assert len(set(xlims)) == 1 and xlims[0][0] == 0 and xlims[0][1] == pytest.approx(longest_h)
    # utilisation in %, the run means as the table shows them
    util = figs["utilisation.png"].axes[0]
    assert isinstance(util.yaxis.get_major_formatter(), PercentFormatter) and "%" in util.get_ylabel()
    assert util.get_ylim()[1] > 100
    FigureCanvasAgg(figs["utilisation.png"]).draw()
    assert all(t.get_text().endswith("%") for t in util.get_yticklabels() if t.get_text())
    texts = [t.get_text() for t in figs["utilisation.png"].legends[0].get_texts()]
    assert texts == [f"{p.name} (run mean {s['gpu_utilisation']:.1%})" for p, s in zip(paths, summaries)]
    for fig in figs.values():
        _legend_outside(fig)
    # the timeline's rows are grouped by model, one tick label per model with its job count
    ax = figs["timeline-rubick.png"].axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    models = {j.model for j in timelines[1].jobs.values()}
    assert sorted(label.split(" (")[0] for label in labels) == sorted(models)
    assert sum(int(label.split("(")[1].rstrip(")")) for label in labels) == 25


def test_a_crowded_timeline_shows_a_sample_per_model(runs, monkeypatch):
    _, paths, summaries = runs
    monkeypatch.setattr(report, "MAX_TIMELINE_ROWS", 10)
    timelines = read_timelines(paths[1:])
    fig = figures(paths[1:], summaries[1:], timelines)["timeline-rubick.png"]
    title = fig._suptitle.get_text()
    assert "one job in 3 of each model" in title and "of 25" in title
    shown = int(title.split("model: ")[1].split(" of")[0])
    assert shown < 25 and shown == sum(int(t.get_text().split("(")[1].rstrip(")"))
                                       for t in fig.axes[0].get_yticklabels())
