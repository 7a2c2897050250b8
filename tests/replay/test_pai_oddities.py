"""What a PAI-format import and its simulation must say rather than hide: jobs capped to one node are
counted, the rows not replayed are counted by reason, an import with no usable job is an error, jobs past
`--max-time-h` are counted as not submitted, times in messages are written out, and GPU utilisation of a run
stopped early never exceeds 100%."""

from __future__ import annotations

import json

import pytest

from controlplane.cli import main
from replay.importers import read_trace
from replay.trace import TraceError

HEADER = "job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,plan_gpu,gpu_type\n"


def pai(tmp_path, rows: list[str], name: str = "pai.csv"):
    path = tmp_path / name
    path.write_text(HEADER + "\n".join(rows) + "\n")
    return path


def test_a_job_over_one_node_is_capped_and_counted(tmp_path, parts):
    path = pai(tmp_path, ["big,worker,65,Terminated,1705270,1708870,600,29,100,V100",
                          "small,worker,2,Terminated,1705300,1706000,600,29,100,V100"])
    trace = read_trace(path, parts.batches)
    assert {j.name: j.gpus for j in trace.jobs} == {"big": 8, "small": 2}
    # its CPUs (65 x 6) follow its GPUs: 390 * 8 / 65 = 48, within a node; the small job keeps its 12
    assert {j.name: j.cpus for j in trace.jobs} == {"big": 48, "small": 12}
    [capped] = trace.capped
    assert capped.line == 2 and "asked for 65 GPUs and 390 CPUs, replayed on 8 and 48" in capped.reason


def test_a_cpu_request_over_one_node_is_cut_to_it_and_counted(tmp_path, parts):
    path = pai(tmp_path, ["cpuheavy,worker,4,Terminated,1705270,1708870,3000,29,100,V100",
                          "fits,worker,4,Terminated,1705300,1706000,2400,29,100,V100"])
    trace = read_trace(path, parts.batches)
    assert {j.name: (j.gpus, j.cpus) for j in trace.jobs} == {"cpuheavy": (4, 96), "fits": (4, 96)}
    [capped] = trace.capped
    assert capped.line == 2 and "asked for 4 GPUs and 120 CPUs, replayed on 4 and 96" in capped.reason


def test_times_in_messages_are_written_out(tmp_path, parts):
    path = pai(tmp_path, ["late,worker,1,Terminated,1705270,1700000,600,29,100,V100"])
    with pytest.raises(TraceError) as err:
        read_trace(path, parts.batches)
    assert "end_time 1700000 before start_time 1705270" in str(err.value) and "e+06" not in str(err.value)


def test_simulate_says_what_it_leaves_out_and_refuses_an_empty_import(tmp_path, capsys):
    rows = [f"j{i},worker,1,Terminated,{i * 600},{i * 600 + 300},600,29,100,V100" for i in range(6)]
    rows += ["f1,worker,1,Failed,10,20,600,29,100,V100", "f2,worker,1,Failed,10,20,600,29,100,V100",
             "c1,worker,1,Terminated,10,20,600,29,0,", "huge,worker,16,Terminated,0,300,600,29,100,V100"]
    path = pai(tmp_path, rows)
    # the last two jobs arrive after 0.6 h (at 0.67 h and 0.83 h): not submitted, and said so
    assert main(["simulate", "--trace", str(path), "--cluster", "2x8", "--policy", "rubick", "--max-time-h", "0.6",
                 "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert "3 line(s) not replayed by the pai layout's rules: 2 status 'Failed'; 1 no GPU asked for" in err
    assert "1 job(s) replayed with fewer GPUs than they asked for" in err and "asked for 16 GPUs" in err
    assert "2 job(s) arrive after --max-time-h 0.6 h and are not submitted" in err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["trace_capped"], summary["trace_after_max_time"], summary["trace_filtered"]) == (1, 2, 3)
    assert 0.0 < summary["gpu_utilisation"] <= 1.0

    only_bad = pai(tmp_path, ["x,worker,1,Terminated,10,5,600,29,100,V100"], "bad.csv")
    assert main(["simulate", "--trace", str(only_bad), "--policy", "rubick", "--on-bad", "skip",
                 "--out", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "no job to replay" in err and "1 bad line(s) skipped" in err
    assert not (tmp_path / "empty" / "summary.json").exists()


def test_utilisation_of_a_run_stopped_before_its_jobs_end_stays_within_the_cluster(tmp_path, capsys):
    """A long job still running at --max-time-h holds GPUs past the last completion."""
    rows = ["short,worker,1,Terminated,0,600,600,29,100,V100", "long,worker,8,Terminated,0,360000,600,29,100,V100"]
    path = pai(tmp_path, rows)
    assert main(["simulate", "--trace", str(path), "--cluster", "1x8", "--policy", "rubick", "--max-time-h", "2",
                 "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["gpu_utilisation"] <= 1.0 + 1e-9
    # the limit as the user gave it, and in seconds written out (never `7200` as `7.2e+03`)
    assert summary["stop_reason"] == "stopped at the time limit, 2 h (7,200 s of simulated time)"
    assert "stopped at the time limit, 2 h (7,200 s of simulated time)" in capsys.readouterr().out


def test_a_simulation_stopped_by_a_time_limit_writes_what_it_simulated(tmp_path):
    """SIGTERM (a batch system's time limit) in the middle of the 10x trace: exit 143, and the run folder
    holds the log and summary up to then, whose decisions replay byte for byte. (On a machine so loaded that the
    command is still reading the trace after 6 s, the run is stopped before its first point in time and the same
    holds with nothing simulated: tests/replay/test_stopping.py.)"""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "simulate", "--trace",
                             str(repo / "data" / "rubick-artifact" / "workload-base.csv"), "--scale", "10",
                             "--cluster", "80x8", "--policy", "rubick", "--no-progress", "--out", str(out)],
                            cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(6)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stdout + stderr
    assert "stopped by SIGTERM" in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"].startswith("stopped early (SIGTERM)")
    assert summary["jobs"]["completed"] < 4060
    check = subprocess.run([sys.executable, "-m", "controlplane.cli", "replay", str(out / "events"), "--only",
                            "policy"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_job_table_gives_users_and_submission_times(tmp_path, parts, capsys):
    tasks = pai(tmp_path, ["a,worker,1,Terminated,1000,2000,600,29,100,V100",
                           "b,worker,2,Terminated,1100,1900,600,29,100,V100",
                           "c,worker,1,Terminated,1200,1300,600,29,100,V100"])
    table = tmp_path / "pai_job_table.csv"  # the published file has no header: job_name,inst_id,user,status,...
    table.write_text("a,1,alice,Terminated,400,2000\nb,2,bob@x,Terminated,1050,1900\n")
    trace = read_trace(tasks, parts.batches, jobs_table=table)
    got = {j.name: (j.submit_s, j.tenant) for j in trace.jobs}
    assert got == {"a": (0.0, "alice"), "b": (650.0, "bob-x"), "c": (800.0, "default")}, got
    assert [j.name for j in trace.jobs] == ["a", "b", "c"]
    broken = tmp_path / "broken.csv"
    broken.write_text("a,1,alice,Terminated,soon,2000\n")
    with pytest.raises(TraceError) as err:
        read_trace(tasks, parts.batches, jobs_table=broken)
    assert "'start_time': 'soon' is not a number" in str(err.value)
    assert main(["simulate", "--trace", str(tasks), "--pai-job-table", str(table), "--policy", "rubick",
                 "--cluster", "1x8", "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    artifact = tmp_path / "art.csv"
    artifact.write_text("name,submission_time,application,num_gpus,exec_plan,steps\nj,0,bert,1,ga,10\n")
    assert main(["simulate", "--trace", str(artifact), "--pai-job-table", str(table), "--policy", "rubick",
                 "--out", str(tmp_path / "art")]) == 2
    assert "joins the pai layout only" in capsys.readouterr().err
