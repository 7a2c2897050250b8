"""A live run: `rubick up --sim-cluster` over a real nats-server, jobs sent with `rubick submit`, then
`rubick replay` of its event log reproduces every decision byte for byte; a changed log is caught."""

from __future__ import annotations


import asyncio
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from controlplane.auth import Identity
from controlplane.cli import main
from controlplane.client import Client
from controlplane.events import decode, encode
from controlplane.recorder import manifest as written
from controlplane.runtime import ControlPlane, UpConfig

JOBS = {  # job id: (model, global batch, GPUs, iterations, guaranteed)
    "vit-a": ("vit", 64, 2, 3000, True),
    "bert-b": ("bert", 32, 2, 1500, False),
    "roberta-c": ("roberta", 64, 4, 1200, False),
    "gpt2-d": ("gpt2", 16, 4, 600, True),
    "t5-e": ("t5", 16, 2, 800, False),
}
SPEED = 200.0


def job_file(folder: Path, job_id: str, model: str, batch: int, gpus: int, iters: int, guaranteed: bool) -> Path:
    path = folder / f"{job_id}.yaml"
    path.write_text(f"job_id: {job_id}\ntenant: team-a\nguaranteed: {str(guaranteed).lower()}\nmodel:\n"
                    f"  type: {model}\nglobal_batch_size: {batch}\nplan:\n  dp: {gpus}\nresources:\n"
                    f"  gpus: {gpus}\ntarget_iterations: {iters}\n")
    return path


def rubick(*args: str) -> list[str]:
    return [sys.executable, "-m", "controlplane.cli", *args]


async def drive(url: str, data_dir: Path, files: list[Path], env: dict) -> dict[str, str]:
    """Submit the jobs with `rubick submit`, and bad bytes; return how each job ended (awaiting the events)."""
    ended: dict[str, str] = {}
    expected = {*JOBS, "bad-unknown-model", None}  # None: the answer to the bad bytes
    all_ended = asyncio.Event()

    async with await Client.connect(url, data_dir=data_dir, identity=Identity("admin")) as client:
        async def on_end(msg) -> None:
            event = decode(msg.data, msg.subject)
            ended.setdefault(event.payload.job_id, event.base)
            if expected <= set(ended):
                all_ended.set()

        subs = [await client.bus.nc.subscribe(s, cb=on_end) for s in ("job.completed", "job.failed", "job.rejected")]
        proc = await asyncio.create_subprocess_exec(
            *rubick("submit", *map(str, files), "--data-dir", str(data_dir), "--wait", "0"),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await proc.communicate()
        assert proc.returncode == 0 and out.decode().count(" submitted as event ") == len(files), err
        await client.bus.nc.publish("job.submitted", b"\x93not an envelope")  # answered by admission's shell
        await asyncio.wait_for(all_ended.wait(), 60)
        for s in subs:
            await s.unsubscribe()
    return ended


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("live")
    env = {**os.environ, "XDG_CACHE_HOME": str(base / "xdg"), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    files = [job_file(base, j, *spec) for j, spec in JOBS.items()]
    bad = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "bad" / "unknown-model.yaml"
    data_dir = base / "rk"
    up = subprocess.Popen(rubick("up", "--data-dir", str(data_dir), "--port", "0", "--metrics-port", "-1",
                                 "--sim-cluster", "2x4", "--sim-speed", f"{SPEED:g}", "--sim-sample-every", "30",
                                 "--roll-seconds", "0.5"),
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready = up.stdout.readline()  # printed once the control plane is up (endpoints.json written)
        while ready and "control plane ready" not in ready:
            ready = up.stdout.readline()
        assert "simulated cluster 2x4 at 200x" in ready, ready + up.stdout.read()
        url = json.loads((data_dir / "endpoints.json").read_text())["nats_url"]
        ended = asyncio.run(drive(url, data_dir, [*files, bad], env))
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 0, out
    assert f"check it: rubick replay {data_dir / 'events'}" in out and "stopped before" not in out
    return data_dir, ended


def copy_log(live_run, tmp_path: Path) -> Path:
    d = tmp_path / "events"
    shutil.copytree(live_run[0] / "events", d)
    return d


def test_a_live_run_replays_byte_for_byte(live_run, capsys):
    data_dir, ended = live_run
    assert ended == {**{j: "job.completed" for j in JOBS}, "bad-unknown-model": "job.rejected", None: "job.rejected"}
    log = data_dir / "events"
    run = json.loads((log / "run.json").read_text())
    assert run["kind"] == "live" and run["config"]["cluster"] == "2x4" and run["config"]["sim_speed"] == SPEED
    frame = pl.concat([pl.read_parquet(log / f["name"]) for f in run["files"]]).sort("seq")
    assert frame["seq"].to_list() == list(range(1, run["files"][-1]["last_seq"] + 1))  # no gap, no duplicate
    subjects = frame["subject"].to_list()
    assert subjects.count("node.registered") == 2 and subjects.count("job.completed") == len(JOBS)
    assert subjects.count("metrics.iteration") > 2 * len(JOBS) and "clock.tick" in subjects
    assert run["consumed"]["policy"] == run["consumed"]["admission"] == frame.height  # everything answered
    decided = subjects.count("plan.decided")
    # the agents' clock: never backwards, and SPEED simulated seconds per wall second (the stream's stored time)
    agents = frame.filter(pl.col("source").str.starts_with("agent-"))
    times = agents["time"].dt.epoch("us").to_list()
    assert times == sorted(times) and agents.height > 2 * len(JOBS)
    stored = agents["stored"].dt.epoch("us").to_list()
    assert 0.5 * SPEED < (times[-1] - times[0]) / (stored[-1] - stored[0]) < 1.5 * SPEED

    assert main(["replay", str(log)]) == 0
    text = capsys.readouterr().out
    assert f"(plan.decided: {decided} of {decided} recorded)" in text and decided >= 2, text
    assert "job.rejected 2" in text  # the unknown model (admission core) and the bad bytes (its shell)
    assert "OK: every recorded decision was reproduced" in text and "a live run spanning" in text


def test_a_live_run_is_simulated_again_under_another_policy(live_run, capsys):
    data_dir, _ = live_run
    log = data_dir / "events"
    run = json.loads((log / "run.json").read_text())
    origin = run["config"]["sim_clock_origin"]
    frame = pl.concat([pl.read_parquet(log / f["name"]) for f in run["files"]]).sort("seq")
    subs = frame.filter((pl.col("subject") == "job.submitted") & (pl.col("source") == "rubick-submit"))
    sent = {j: (t / 1e6 - origin) * SPEED for j, t in zip(subs["job_id"], subs["time"].dt.epoch("us"))}
    assert main(["replay", str(log), "--policy", "equal", "--out", str(data_dir / "wi")]) == 0
    summary = json.loads((data_dir / "wi" / "summary.json").read_text())
    assert summary["config"]["policy"] == "equal" and summary["what_if_of"] == str(log)
    assert summary["what_if_clock"] == {"sim_clock_origin": origin, "sim_speed": SPEED}
    per_job = {j["job_id"]: j for j in summary["per_job"]}
    assert {j for j, v in per_job.items() if v["status"] == "completed"} == set(JOBS)
    assert per_job["bad-unknown-model"]["status"] == "rejected"
    # each submission arrives when it reached the live run's simulated clock, counted from its start-up
    assert {j: per_job[j]["submitted_s"] for j in sent} == pytest.approx(sent, abs=1e-3)
    assert 0 < min(sent.values()) and max(sent.values()) < 3600
    assert "wi: equal: 5/6 jobs done" in capsys.readouterr().out


def test_a_changed_decision_in_a_live_log_is_caught(live_run, tmp_path, capsys):
    log = copy_log(live_run, tmp_path)
    run = json.loads((log / "run.json").read_text())
    for f in run["files"]:  # the first file holding a decision that places a job
        path = log / f["name"]
        frame = pl.read_parquet(path)
        rows = [i for i, (s, d) in enumerate(zip(frame["subject"], frame["data"]))
                if s == "plan.decided" and decode(d, s).payload.decisions[0].allocation]
        if rows:
            break
    idx = rows[0]
    event = decode(frame["data"][idx], "plan.decided")
    first = event.payload.decisions[0]
    changed = first.__class__(**{**first.__dict__, "predicted_throughput": first.predicted_throughput * 2})
    event = event.__class__(**{**event.__dict__, "payload": event.payload.__class__(
        **{**event.payload.__dict__, "decisions": (changed, *event.payload.decisions[1:])})})
    data = frame["data"].to_list()
    data[idx] = encode(event)
    frame.with_columns(pl.Series("data", data, dtype=pl.Binary)).write_parquet(path)
    f["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()  # the manifest agrees: only replay can tell
    f["bytes"] = path.stat().st_size
    (log / "run.json").write_text(json.dumps(run))

    assert main(["replay", str(log)]) == 1
    text = capsys.readouterr().out
    assert f"DIVERGED at event {frame['seq'][idx]} (answer of the policy core)" in text, text
    assert f"'predicted_throughput': {changed.predicted_throughput}" in text


def test_a_changed_file_of_a_live_log_is_named(live_run, tmp_path, capsys):
    log = copy_log(live_run, tmp_path)
    run = json.loads((log / "run.json").read_text())
    # the second file where there are two or more: the recorder's compaction may have merged a slow run's into one
    victim = log / run["files"][min(1, len(run["files"]) - 1)]["name"]
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    victim.write_bytes(bytes(raw))
    assert main(["replay", str(log)]) == 2
    text = capsys.readouterr().out
    assert f"{victim.name}: its bytes differ from the run's manifest" in text
    assert "OK: every recorded decision" not in text


def test_a_live_log_whose_run_did_not_stop_cleanly_still_replays_and_says_so(live_run, tmp_path, capsys):
    log = copy_log(live_run, tmp_path)
    run = json.loads((log / "run.json").read_text())
    del run["consumed"]
    run["files"] = []  # what run.json holds until the control plane stops
    (log / "run.json").write_text(json.dumps(run))
    last = max(f.name for f in log.glob("*.parquet"))
    (log / last).unlink()  # the log ends early, as after a crash: the last file's write never completed,
    [stream] = written.streams(log)  # and the recorder dropped its manifest line when it started again
    written.write(log, stream, [e for e in written.read(log, stream).entries if e["name"] != last])
    code = main(["replay", str(log)])
    text = capsys.readouterr().out
    assert "note: run.json has no record of what each core had handled" in text
    assert code == 0 and "OK: every recorded decision was reproduced" in text, text


async def test_a_simulated_cluster_needs_a_fresh_data_dir(live_run, tmp_path):
    data_dir = tmp_path / "rk"
    shutil.copytree(live_run[0], data_dir, ignore=shutil.ignore_patterns("endpoints.json"))
    plane = ControlPlane(UpConfig(data_dir=data_dir, nats_port=0, metrics_port=-1, sim_cluster="2x4"))
    with pytest.raises(RuntimeError, match="a simulated cluster needs a fresh stream and event log"):
        await plane.start()
    await plane.stop()
    assert main(["up", "--data-dir", str(tmp_path / "x"), "--sim-speed", "10"]) == 2


async def test_a_live_control_plane_loads_the_solver_at_start_up(tmp_path, monkeypatch):
    """The first online refit must not stall the shared event loop on the solver's import: `up` loads
    it while the model services start, before they consume anything."""
    import modeler.fit

    loaded = []
    monkeypatch.setattr(modeler.fit, "load_solver", lambda: loaded.append(True))
    plane = ControlPlane(UpConfig(data_dir=tmp_path / "rk", nats_port=0, metrics_port=-1, sim_cluster="1x2",
                                  tick_period_s=0))
    try:
        await plane.start()
        await asyncio.wait_for(plane.models_ready.wait(), 60)
        assert loaded == [True]
    finally:
        await plane.stop()
