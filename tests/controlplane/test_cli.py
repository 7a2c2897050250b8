"""`rubick up`, `submit`, `schema`, `status` and `demo` as a user runs them: real processes, real NATS."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import jsonschema
import msgpack
import pytest

from controlplane.cli import main
from controlplane.eventlog import scan
from controlplane.events import encode

from .samples import PAYLOADS, sample

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "examples" / "jobs"


def rubick(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controlplane.cli", *args], capture_output=True, text=True,
                          timeout=120, **kw)


@pytest.fixture
def up(tmp_path):
    """`rubick up` in a fresh folder, on free ports."""
    proc = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "up", "--data-dir", str(tmp_path / "rk"),
                             "--port", "0", "--metrics-port", "0", "--tick-period", "0.5", "--roll-seconds", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    assert "ready in" in line, line + proc.stdout.read()
    endpoints = json.loads((tmp_path / "rk" / "endpoints.json").read_text())
    yield proc, endpoints, line
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def test_up_submit_and_clean_shutdown(up, tmp_path):
    proc, endpoints, line = up
    url = endpoints["nats_url"]
    assert url in line and endpoints["event_log"] in line and "metrics http://" in line
    rk = str(tmp_path / "rk")  # where `rubick up` keeps the credentials its commands find
    assert "nkey auth" in line
    bare = rubick("submit", str(JOBS / "gpt2-guaranteed.yaml"), "--nats-url", url, "--data-dir", str(tmp_path / "none"))
    assert bare.returncode == 1 and "requires credentials" in bare.stderr and "Traceback" not in bare.stderr
    ok = rubick("submit", str(JOBS / "gpt2-guaranteed.yaml"), str(JOBS / "roberta-small.yaml"), "--nats-url", url,
                "--data-dir", rk)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("submitted as event") == 2
    reused = rubick("submit", str(JOBS / "gpt2-guaranteed.yaml"), "--nats-url", url, "--data-dir", rk)
    assert reused.returncode == 1 and "REJECTED: job id reused" in reused.stdout
    unknown = rubick("submit", str(JOBS / "bad" / "unknown-model.yaml"), "--data-dir", str(tmp_path / "rk"))
    assert unknown.returncode == 1 and "unknown model type" in unknown.stdout and "model.type" in unknown.stdout
    for said in (reused.stdout, unknown.stdout):  # a rejection names its field, and no empty "expected , got"
        assert "expected ," not in said and not said.rstrip().endswith("got )"), said
    absurd = rubick("submit", str(JOBS / "bad" / "million-gpus.yaml"), "--nats-url", url, "--data-dir", rk)
    assert absurd.returncode == 2 and "out of range" in absurd.stderr and "1000000" in absurd.stderr
    metrics = urllib.request.urlopen(endpoints["metrics_url"], timeout=5).read().decode()
    assert 'rubick_messages_in_total{service="admission",subject="job.submitted"}' in metrics
    assert "rubick_handler_seconds" in metrics and "rubick_consumer_lag" in metrics
    status = rubick("status", "--nats-url", url, "--data-dir", rk)
    assert status.returncode == 0 and "gpt2-demo-1" in status.stdout and "bad-unknown-model" in status.stdout
    explain = rubick("explain", "gpt2-demo-1", "--data-dir", rk)  # the running `rubick up`, found as status finds it
    assert explain.returncode == 0 and "job gpt2-demo-1" in explain.stdout, explain.stderr
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "stopped:" in out
    frame = scan(endpoints["event_log"]).frame
    subjects = frame["subject"].to_list()
    assert subjects.count("job.submitted") == 4 and subjects.count("job.rejected") == 2  # the bare one never got in
    assert "clock.tick" in subjects
    assert frame["seq"].to_list() == list(range(1, frame.height + 1))  # everything stored is in the log
    assert not (tmp_path / "rk" / "endpoints.json").exists()


def test_up_with_an_existing_nats(nats_server, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "up", "--nats-url", nats_server.url,
                             "--data-dir", str(tmp_path / "rk"), "--metrics-port", "-1", "--tick-period", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert "external NATS" in line and nats_server.url in line
        res = rubick("submit", str(JOBS / "llama7-offload.yaml"), "--nats-url", nats_server.url)
        assert res.returncode == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    subjects = scan(tmp_path / "rk" / "events").frame["subject"].to_list()
    assert subjects[0] == "job.submitted" and set(subjects[1:]) <= {"plan.pending"}  # no node: it waits


def test_submit_without_a_server_is_a_clear_error(tmp_path):
    res = rubick("submit", str(JOBS / "gpt2-guaranteed.yaml"), "--nats-url", "nats://127.0.0.1:1")
    assert res.returncode == 1 and "cannot reach NATS" in res.stderr


def test_submit_refuses_broken_files_before_sending(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("job_id: [unclosed\n")
    res = rubick("submit", str(bad), "--nats-url", "nats://127.0.0.1:1")
    assert res.returncode == 2 and "not valid YAML" in res.stderr
    bad.write_text("job_id: x\ntenant: t\n")
    res = rubick("submit", str(bad), "--nats-url", "nats://127.0.0.1:1")
    assert res.returncode == 2 and "missing required field" in res.stderr


@pytest.mark.parametrize("subject", sorted(PAYLOADS))
def test_schema_validates_real_messages(subject, capsys):
    assert main(["schema", subject]) == 0
    schema = json.loads(capsys.readouterr().out)
    message = msgpack.unpackb(encode(sample(subject)))
    jsonschema.validate(message, schema)
    message["data"]["unexpected"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(message, schema)


def test_schema_of_an_unknown_subject(capsys):
    assert main(["schema", "job.exploded"]) == 2
    assert "unknown subject" in capsys.readouterr().err


def test_demo_runs_end_to_end(tmp_path):
    t0 = time.monotonic()
    res = rubick("demo", "--data-dir", str(tmp_path / "demo"))
    assert res.returncode == 0, res.stderr
    assert "REJECTED (job id reused)" in res.stdout and "REJECTED (unknown model type" in res.stdout
    # a cluster day: jobs run on simulated agents, one is cancelled, the others complete, one is shrunk
    assert "stopped cleanly" in res.stdout and "jobs: 1 cancelled, 2 completed; 2 rejected" in res.stdout
    assert "all jobs ended after" in res.stdout and "(0 samples/s; cancelled)" in res.stdout
    assert "shrunk)" in res.stdout and "job.reconfigured" in res.stdout
    assert "average JCT of the 2 completed jobs" in res.stdout and "GPU utilisation:" in res.stdout
    # the run is kept: the log commands read it afterwards
    assert f"the run is kept in {tmp_path / 'demo'}" in res.stdout
    assert main(["log", "stats", str(tmp_path / "demo")]) == 0
    again = rubick("demo", "--data-dir", str(tmp_path / "demo"))
    assert again.returncode == 2 and "already holds a run" in again.stderr
    assert "profile the model type first" in res.stdout  # a new type without a forward time: the policy refuses it
    assert "plan.decided by the policy:" in res.stdout and "gpt2-demo-1: dp" in res.stdout
    assert "OK: every recorded decision was reproduced" in res.stdout  # the demo's own log, replayed
    assert time.monotonic() - t0 < 120


def test_a_rejection_prints_only_what_it_says():
    from controlplane.cli.submit import _which
    from controlplane.events.payloads import Rejected

    spec = Rejected(subject="job.submitted", reason="model m: the spec has no profiled forward time", field="model")
    assert _which(spec) == " (field model)"
    full = Rejected(subject="job.submitted", reason="r", field="gpus", expected="<= 65536", got="1000000")
    assert _which(full) == " (field gpus: expected <= 65536, got 1000000)"
    assert _which(Rejected(subject="job.submitted", reason="r")) == ""

