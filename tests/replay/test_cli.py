"""`rubick simulate`, `report` and `replay` as a user runs them."""

from __future__ import annotations

import json
import shutil

import polars as pl
import pytest

from controlplane.cli import main
from replay.report import default_out

from .conftest import trace_slice


def test_simulate_report_and_replay(tmp_path, capsys):
    trace = trace_slice(tmp_path, "workload-mt.csv", rows=25, start=20)
    runs = tmp_path / "runs"
    assert main(["simulate", "--trace", str(trace), "--cluster", "8x8", "--policies", "rubick,antman",
                 "--out", str(runs)]) == 0
    printed = capsys.readouterr().out
    assert "rubick: 25/25 jobs done" in printed and "events/s" in printed and "modeler" in printed
    for name in ("rubick", "antman"):
        summary = json.loads((runs / name / "summary.json").read_text())
        assert summary["config"]["policy"] == name and summary["config"]["trace"] == str(trace)
        assert summary["guaranteed"]["n"] > 0
    assert main(["report", str(runs / "rubick"), str(runs / "antman"), "--out", str(tmp_path / "rep")]) == 0
    table = capsys.readouterr().out
    assert "avg JCT h" in table and "SLO viol." in table
    assert [line.split()[0] for line in table.splitlines()[2:4]] == ["rubick", "antman"]
    for png in ("jct_cdf.png", "utilisation.png", "timeline-rubick.png", "timeline-antman.png"):
        data = (tmp_path / "rep" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    # the folder `--policies` wrote stands for its runs; its plots go beside them, and a later
    # `report runs/*` passes over that plots folder but names what is not a run
    (runs / "notes").mkdir()
    assert main(["report", str(runs)]) == 0
    captured = capsys.readouterr()
    assert [line.split()[0] for line in captured.out.splitlines()[2:4]] == ["antman", "rubick"]
    assert (runs / "report" / "jct_cdf.png").is_file() and captured.err == ""
    assert default_out([runs / "a" / "x", runs / "b", runs / "a" / "y"]) == runs / "report"
    assert main(["report", *sorted(map(str, runs.iterdir())), "--no-plots"]) == 0
    captured = capsys.readouterr()
    assert [line.split()[0] for line in captured.out.splitlines()[2:]] == ["antman", "rubick"]
    assert captured.err.strip() == f"rubick: {runs / 'notes'}: no summary.json in it or in its folders; left out"
    assert main(["report", str(tmp_path / "nowhere"), "--no-plots"]) == 2
    assert "nowhere: no such folder; left out" in capsys.readouterr().err
    assert main(["replay", str(runs / "rubick" / "events"), "--jobs", "3"]) == 0
    printed = capsys.readouterr().out
    # admission reads every event: it is checked in the process that decodes them all, beside the policy
    assert "OK: every recorded decision was reproduced" in printed and "2 processes)" in printed
    assert main(["replay", str(runs / "rubick" / "events"), "--jobs", "1"]) == 0
    printed = capsys.readouterr().out
    assert "OK: every recorded decision was reproduced" in printed and "processes" not in printed
    assert main(["replay", str(runs / "rubick"), "--jobs", "1"]) == 0  # the run folder for its log
    printed = capsys.readouterr().out
    assert f"replay of {runs / 'rubick' / 'events'}:" in printed and "OK: every recorded decision" in printed
    assert main(["replay", str(runs / "rubick" / "events"), "--jobs", "0"]) == 2
    assert "--jobs must be >= 1 processes, got 0" in capsys.readouterr().err
    assert main(["replay", str(runs / "rubick" / "events"), "--policy", "equal", "--out", str(tmp_path / "wi")]) == 0
    assert json.loads((tmp_path / "wi" / "summary.json").read_text())["config"]["policy"] == "equal"


def test_bad_traces_are_refused_or_skipped_by_line(tmp_path, capsys):
    trace = tmp_path / "bad.csv"
    trace.write_text("name,submission_time,duration,application,num_gpus,num_cpus,bandwidth,exec_plan,steps,is_sla\n"
                     "a-0,0,1,vit,1,8,0,ga,5,0\nb-1,1,1,vit,0,8,0,ga,5,0\nc-2,2,1,vit,1,8,0,ga,5,0\n")
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(trace), "--policy", "rubick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "line 3: zero or negative GPUs" in err and not out.exists()
    assert main(["simulate", "--trace", str(trace), "--policy", "rubick", "--out", str(out), "--on-bad", "skip"]) == 0
    captured = capsys.readouterr()
    assert "1 bad line(s) skipped" in captured.err and "2/2 jobs done" in captured.out
    assert main(["simulate", "--trace", str(trace), "--policy", "nope", "--out", str(out)]) == 2
    assert "unknown policy nope" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "nowhere")]) == 2


def test_artifact_costs_and_quotas_reach_the_run(tmp_path, capsys):
    """`--artifact-costs` charges 260 s on every start and restart; `--quotas` limits guaranteed jobs:
    with a quota of 0 GPUs no guaranteed job is covered by the guarantee."""
    trace = trace_slice(tmp_path, "workload-mt.csv", rows=12, start=20)
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("default: 0\n")
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(trace), "--policy", "rubick", "--artifact-costs", "--quotas", str(quotas),
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["start_cost_s"] == 260 and summary["config"]["restart_cost_s"] == 260
    assert summary["config"]["quotas"] == {"default": 0}
    assert summary["guaranteed"]["n"] > 0 and summary["guaranteed_within_quota"] == 0
    assert summary["slo_violations_within_quota"] == 0
    assert summary["restarts"]["counts"]["start"] == summary["jobs"]["completed"] > 0
    assert summary["restarts"]["seconds"]["start"] >= 260 * summary["restarts"]["counts"]["start"]  # a launch cut short starts over
    assert all(j["jct_s"] >= 260 for j in summary["per_job"] if j["status"] == "completed")
    quotas.write_text("default: -3\n")
    assert main(["simulate", "--trace", str(trace), "--policy", "rubick", "--quotas", str(quotas),
                 "--out", str(tmp_path / "bad")]) == 2
    assert "quotas must map tenant names" in capsys.readouterr().err


def test_a_report_on_a_damaged_log_names_what_its_plots_leave_out(tmp_path, capsys):
    """The table comes from summary.json; the time plots from the event log. A truncated log file or a
    missing log folder is named, and the plots are drawn from what could be read."""
    trace = trace_slice(tmp_path, "workload-base.csv", rows=8)
    runs = tmp_path / "runs"
    assert main(["simulate", "--trace", str(trace), "--policies", "rubick,sia", "--out", str(runs)]) == 0
    capsys.readouterr()
    shutil.copytree(runs / "rubick", runs / "garbled")
    [garbled] = sorted((runs / "garbled" / "events").glob("*.parquet"))
    frame = pl.read_parquet(garbled)
    frame.with_columns(pl.when(pl.col("seq") == 3).then(pl.lit(b"\xc1")).otherwise(pl.col("data"))
                       .alias("data")).write_parquet(garbled)
    [log_file] = sorted((runs / "rubick" / "events").glob("*.parquet"))
    log_file.write_bytes(log_file.read_bytes()[:4000])
    for f in (runs / "sia" / "events").iterdir():
        f.unlink()
    (runs / "sia" / "events").rmdir()
    assert main(["report", str(runs / "rubick"), str(runs / "sia"), str(runs / "garbled"),
                 "--out", str(tmp_path / "rep")]) == 0
    captured = capsys.readouterr()
    assert "rubick" in captured.out and "sia" in captured.out  # the table is whole
    assert f"warning: {runs / 'garbled' / 'events'}: 1 row(s) that are not valid events left out" in captured.err
    assert (tmp_path / "rep" / "timeline-garbled.png").is_file()
    assert f"warning: {log_file}: unreadable Parquet" in captured.err
    assert f"warning: {runs / 'sia'}: no event log" in captured.err
    assert (tmp_path / "rep" / "utilisation.png").is_file()
    assert not (tmp_path / "rep" / "timeline-rubick.png").exists() and not (tmp_path / "rep" / "timeline-sia.png").exists()


@pytest.mark.parametrize("option,value", [
    ("--tick", "0"), ("--tick", "-5"), ("--tick", "nan"), ("--tick", "inf"),
    ("--sample-every", "0"), ("--sample-every", "nan"), ("--noise", "-1"), ("--noise", "nan"),
    ("--restart-cost", "-1"), ("--restart-cost", "nan"), ("--start-cost", "inf"), ("--batch", "nan"),
    ("--hold", "-1"), ("--max-time-h", "0"), ("--max-time-h", "-1"), ("--max-time-h", "nan"),
    ("--seed", "-1"), ("--scale", "0"), ("--refit-backoff", "-1"), ("--refit-backoff", "21"),
])
def test_an_impossible_number_is_refused_before_anything_runs(tmp_path, capsys, option, value):
    trace = trace_slice(tmp_path, "workload-base.csv", rows=3)
    out = tmp_path / "run"
    assert main(["simulate", "--trace", str(trace), "--policy", "rubick", "--out", str(out), option, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rubick: {option} must be") and value in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("option,value", [("--restart-cost", "nan"), ("--restart-cost", "-1"), ("--context", "-1"),
                                          ("--jobs", "0"), ("--only", ","), ("--only", "nope")])
def test_replay_refuses_an_impossible_number(tmp_path, capsys, option, value):
    trace = trace_slice(tmp_path, "workload-base.csv", rows=3)
    run = tmp_path / "run"
    assert main(["simulate", "--trace", str(trace), "--policy", "rubick", "--out", str(run)]) == 0
    capsys.readouterr()
    args = ["replay", str(run / "events"), option, value] + (["--out", str(tmp_path / "wi")]
                                                             if option == "--restart-cost" else [])
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("rubick: ") and "Traceback" not in err
    assert ("no core named" if option == "--only" else "must be") in err
    assert not (tmp_path / "wi").exists()


def test_an_out_path_that_is_a_file_is_refused_by_name(tmp_path, capsys):
    trace = trace_slice(tmp_path, "workload-base.csv", rows=3)
    run = tmp_path / "run"
    assert main(["simulate", "--trace", str(trace), "--policy", "rubick", "--out", str(run)]) == 0
    capsys.readouterr()
    taken = tmp_path / "taken"
    taken.write_text("a file\n")
    for args in (["simulate", "--trace", str(trace), "--policy", "rubick", "--out", str(taken)],
                 ["simulate", "--trace", str(trace), "--policy", "rubick", "--out", str(taken / "run")],
                 ["simulate", "--trace", str(trace), "--policies", "rubick,sia", "--out", str(taken)],
                 ["report", str(run), "--out", str(taken)],
                 ["replay", str(run / "events"), "--policy", "sia", "--out", str(taken)]):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith(f"rubick: --out {args[args.index('--out') + 1]}: ") and "Traceback" not in err, err
        assert "not a folder" in err
    assert taken.read_text() == "a file\n"
    (run / "sia").write_text("in the way\n")
    assert main(["simulate", "--trace", str(trace), "--policies", "rubick,sia", "--out", str(run)]) == 2
    assert f"--out {run / 'sia'}: exists and is not a folder" in capsys.readouterr().err


def test_a_what_if_of_a_folder_without_a_readable_run_json_says_so(tmp_path, capsys):
    log = tmp_path / "events"
    log.mkdir()
    assert main(["replay", str(log), "--policy", "sia", "--out", str(tmp_path / "wi")]) == 2
    assert f"{log / 'run.json'}: missing, so the run's configuration" in capsys.readouterr().err
    (log / "run.json").write_text('{"config": ')
    assert main(["replay", str(log), "--policy", "sia", "--out", str(tmp_path / "wi")]) == 2
    assert f"{log / 'run.json'}: unreadable (" in capsys.readouterr().err
    (log / "run.json").write_text('{"kind": "live", "config": {"policy": "rubick"}, "params": {}}')
    assert main(["replay", str(log), "--policy", "sia", "--out", str(tmp_path / "wi")]) == 2
    assert "a live run without its simulated clock" in capsys.readouterr().err
    assert not (tmp_path / "wi").exists()


def test_a_batch_command_runs_without_the_collector_and_gives_it_back_to_a_caller(tmp_path, capsys):
    """`controlplane.cli.BATCH`: run as the program, `rubick simulate` leaves the collector off to the exit (no heap
    walked at the end); called in the same process with its arguments, it switches it back on as it was."""
    import gc
    import subprocess
    import sys
    from pathlib import Path

    trace = trace_slice(tmp_path, "workload-base.csv", rows=4)
    args = ["simulate", "--trace", str(trace), "--cluster", "8x8", "--policy", "rubick", "--no-progress"]
    assert gc.isenabled()
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert gc.isenabled(), "a batch command left its caller's collector off"
    assert "jobs done" in capsys.readouterr().out
    probe = ("import atexit, gc, sys\natexit.register(lambda: print('collector on at exit:', gc.isenabled()))\n"
             "from controlplane.cli import main\nsys.argv = ['rubick', *sys.argv[1:]]\nsys.exit(main())\n")
    root = Path(__file__).resolve().parents[2]
    for command, on in ((args, False), (["schema", "clock.tick"], True)):
        done = subprocess.run([sys.executable, "-c", probe, *command, *(["--out", str(tmp_path / "b")]
                                                                         if command is args else [])],
                              cwd=root, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert f"collector on at exit: {on}" in done.stdout, (command, done.stdout[-300:])


@pytest.mark.parametrize("value", [21, -1, 6.5, True, "6"])
def test_a_run_json_with_an_impossible_refit_backoff_is_refused_when_replayed(tmp_path, capsys, value):
    trace = trace_slice(tmp_path, "workload-base.csv", rows=3)
    run = tmp_path / "run"
    assert main(["simulate", "--trace", str(trace), "--policy", "rubick", "--out", str(run), "--no-progress"]) == 0
    record = run / "events" / "run.json"
    doc = json.loads(record.read_text())
    assert doc["config"]["refit_backoff"] == 3
    assert main(["replay", str(run / "events")]) == 0
    doc["config"]["refit_backoff"] = value
    record.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["replay", str(run / "events")]) != 0
    err = capsys.readouterr().err
    assert "refit_backoff must be a whole number 0..20" in err and "Traceback" not in err
