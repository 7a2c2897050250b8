"""Whole simulated runs with the real cores: determinism, the live log schema, the summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from controlplane.eventlog import events as read_events
from controlplane.eventlog import scan
from controlplane.recorder.rows import SCHEMA
from replay.config import RunConfig
from replay.importers import read_trace
from replay.run import ground_truth, reference_time, simulate, trace_inputs
from replay.summary import summarize

from .conftest import ARTIFACT
from .doubles import fifo_factory


def jobs_of(parts, name="workload-base.csv", n=40, start=0):
    return read_trace(ARTIFACT / name, parts.batches).jobs[start:start + n]


@pytest.fixture(scope="module")
def rubick_runs(parts, tmp_path_factory):
    cfg = RunConfig(policy="rubick", cluster="2x8")
    jobs = jobs_of(parts)
    outs = []
    for i in range(2):
        d = tmp_path_factory.mktemp(f"run{i}")
        outs.append((d, simulate(cfg, trace_inputs(cfg, jobs, parts), parts, out_dir=d)))
    return outs


def test_the_same_run_twice_gives_identical_files(rubick_runs):
    (a, _), (b, _) = rubick_runs
    files_a = sorted(p.name for p in (a / "events").iterdir())
    assert files_a == sorted(p.name for p in (b / "events").iterdir()) and len(files_a) == 3  # log, manifest, run
    assert sum(name.startswith("manifest-") for name in files_a) == 1
    for name in files_a:
        assert (a / "events" / name).read_bytes() == (b / "events" / name).read_bytes()
    assert (a / "summary.json").read_bytes() == (b / "summary.json").read_bytes()


def test_the_log_is_a_live_event_log(rubick_runs):
    d, out = rubick_runs[0]
    logscan = scan(d / "events")
    assert not logscan.problems and dict(logscan.frame.drop("stream").schema) == SCHEMA
    decoded = read_events(d / "events")
    assert not decoded.undecodable and len(decoded.events) == len(out.result.events)
    assert logscan.frame["seq"].to_list() == list(range(1, len(decoded.events) + 1))
    times = logscan.frame["time"].dt.epoch("us").to_list()
    assert times == sorted(times)
    subjects = set(logscan.frame["subject"].unique().to_list())
    assert {"node.registered", "job.submitted", "plan.decided", "job.started", "job.completed",
            "metrics.iteration", "clock.tick"} <= subjects
    decided = logscan.frame.filter(pl.col("subject") == "plan.decided")
    assert decided["jobs"].list.len().min() >= 1


def test_the_summary_follows_from_the_log(rubick_runs, parts):
    d, out = rubick_runs[0]
    summary = json.loads((d / "summary.json").read_text())
    evs = read_events(d / "events").events
    wire = scan(d / "events").frame["data"].to_list()
    again = summarize(evs, wire, reference_time(ground_truth(parts), 8))
    for key in ("jct", "makespan_s", "gpu_utilisation", "reconfigurations", "plan_decided_sha256", "events"):
        assert again[key] == summary[key]
    jobs = summary["jobs"]
    assert jobs["completed"] == summary["jct"]["n"] and jobs["completed"] + jobs["rejected"] == 40
    rejected = [j for j in summary["per_job"] if j["status"] == "rejected"]
    assert rejected and all(j["gpus"] > 16 for j in rejected)  # larger than the 2x8 cluster: admission refuses
    done = [j for j in summary["per_job"] if j["status"] == "completed"]
    assert all(j["jct_s"] == pytest.approx(j["end_s"] - j["submitted_s"]) for j in done)
    assert 0 < summary["gpu_utilisation_busy"] <= summary["gpu_utilisation"] <= 1
    assert summary["capacity_violations"] == 0 and summary["stop_reason"] == "all jobs finished"
    assert summary["config"]["policy"] == "rubick" and summary["cluster_gpus"] == 16


def test_guaranteed_jobs_are_checked_against_their_requested_run(parts, tmp_path):
    cfg = RunConfig(policy="fifo", cluster="8x8")
    jobs = jobs_of(parts, "workload-mt.csv", n=60)
    out = simulate(cfg, trace_inputs(cfg, jobs, parts), parts, policy_factory=fifo_factory)
    ref = reference_time(ground_truth(parts), 8)
    s = out.summary
    guaranteed = [j for j in s["per_job"] if j["guaranteed"]]
    assert guaranteed and s["guaranteed"]["n"] == len(guaranteed)
    for j in guaranteed:
        sub = next(x for x in jobs if x.name == j["job_id"]).submission(parts.batches[j["model"]])
        assert j["slo_jct_s"] == pytest.approx(sub.target_iterations * ref(sub))
        assert j["slo_violated"] == (j["jct_s"] > j["slo_jct_s"] * (1 + 1e-9) + 1e-6)
    assert s["slo_violations"] == sum(j["slo_violated"] for j in guaranteed)
    # the test double runs every job on its request, so a job that never queued meets its SLO exactly
    immediate = [j for j in guaranteed if j["jct_s"] == pytest.approx(j["slo_jct_s"])]
    assert immediate and not any(j["slo_violated"] for j in immediate)
    assert all(j["wait_s"] == 0 for j in immediate)
    late = [j for j in guaranteed if j["slo_violated"]]
    assert s["slo_violations_after_waiting"] == sum(1 for j in late if j["wait_s"] > 0)


def test_a_policy_that_starves_jobs_stops_the_run(parts):
    class Idle:
        name, subjects = "policy", ("job.submitted",)

        def handle(self, event):
            return []

    cfg = RunConfig(policy="idle", cluster="8x8")
    out = simulate(cfg, trace_inputs(cfg, jobs_of(parts, n=3), parts), parts, policy_factory=lambda c, p: Idle())
    assert out.summary["stop_reason"].startswith("stalled") and out.summary["jobs"]["unfinished"] == 3


def test_held_gpus_never_exceed_the_cluster(rubick_runs):
    from replay.report import held_series
    from replay.timeline import build

    d, out = rubick_runs[0]
    tl = build(out.result.events)
    _, held = held_series(tl)
    assert tl.total_gpus == 16 and 0 < held.max() <= 16 and held.min() >= 0
    assert all(s.end > s.start for job in tl.jobs.values() for s in job.segments)


def test_window_means_weigh_a_step_function_by_time():
    """The utilisation plot shows time-weighted means over windows, not every step."""
    from replay.report import window_means

    # 4 GPUs from 0 to 30 s, 8 from 30 to 90 s, 0 after; windows of 60 s
    edges, means = window_means(np.array([0.0, 30.0, 90.0]), np.array([4.0, 8.0, 0.0]), 60.0, end=120.0)
    assert edges.tolist() == [0.0, 60.0, 120.0]
    assert means.tolist() == [(4 * 30 + 8 * 30) / 60, 8 * 30 / 60]
    # nothing before the first step; the last window stops at `end`
    edges, means = window_means(np.array([10.0, 20.0]), np.array([6.0, 3.0]), 15.0, end=40.0)
    assert edges.tolist() == [0.0, 15.0, 30.0, 40.0]
    assert means.tolist() == [6 * 5 / 15, (6 * 5 + 3 * 10) / 15, 3.0]
    edges, means = window_means(np.array([]), np.array([]), 10.0, end=0.0)
    assert len(means) == 0


def test_the_collector_rests_while_the_cores_run_and_is_on_again_after(parts):
    """`controlplane.gc_tuning.pausing`: the cores make no reference cycles (tests/policy/test_no_cycles.py), so the
    collector's passes would only walk the events the run keeps."""
    import gc

    seen = []

    class Watching:
        name, subjects = "policy", ("job.submitted",)

        def handle(self, event):
            seen.append(gc.isenabled())
            return []

    class Failing(Watching):
        def handle(self, event):
            raise RuntimeError("a policy that breaks")

    cfg = RunConfig(policy="watching", cluster="8x8")
    assert gc.isenabled()
    simulate(cfg, trace_inputs(cfg, jobs_of(parts, n=3), parts), parts, policy_factory=lambda c, p: Watching())
    assert seen and not any(seen), "the collector ran while the policy core handled events"
    assert gc.isenabled(), "the collector stayed off after the run"
    with pytest.raises(RuntimeError, match="breaks"):
        simulate(cfg, trace_inputs(cfg, jobs_of(parts, n=3), parts), parts, policy_factory=lambda c, p: Failing())
    assert gc.isenabled(), "the collector stayed off after a run that failed"
