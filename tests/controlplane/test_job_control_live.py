"""`rubick suspend|resume|cancel|priority` and `rubick quota set|show` against a running `rubick up` with a simulated
cluster (simulated node agents over the real bus and a real nats-server): the job stops, waits, runs again,
ends cancelled; a quota changes live; what cannot apply is refused with exit 1 and the reason; the log
replays byte for byte."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "jobs" / "roberta-small.yaml"


def rubick(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controlplane.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def status_of(rk: Path, job_id: str) -> str:
    res = rubick("status", "--data-dir", str(rk))
    for line in res.stdout.splitlines():
        words = line.split()
        if words and words[0] == job_id:
            return words[1]
    return ""


def until_status(rk: Path, job_id: str, want: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        seen = status_of(rk, job_id)
        if seen == want:
            return
        time.sleep(0.3)
    raise AssertionError(f"{job_id} is {seen!r}, not {want!r}")


def test_suspend_resume_cancel_from_the_command_line(tmp_path):
    rk = tmp_path / "rk"
    up = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "up", "--data-dir", str(rk), "--port", "0",
                           "--metrics-port", "-1", "--tick-period", "0.5", "--roll-seconds", "0.2",
                           "--sim-cluster", "1x8", "--sim-speed", "20", "--restart-cost", "5"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    try:
        assert "ready in" in up.stdout.readline()
        endpoints = json.loads((rk / "endpoints.json").read_text())
        assert endpoints["sim_speed"] == 20 and endpoints["sim_clock_origin"] > 1e9, "for outside publishers' clocks"
        job_id = "roberta-demo-1"
        assert rubick("submit", str(JOB), "--data-dir", str(rk)).returncode == 0
        until_status(rk, job_id, "running")

        res = rubick("suspend", job_id, "--data-dir", str(rk), "--reason", "make room")
        assert res.returncode == 0 and "suspended" in res.stdout, res.stdout + res.stderr
        until_status(rk, job_id, "suspended")
        again = rubick("suspend", job_id, "--data-dir", str(rk))
        assert again.returncode == 1 and f"job {job_id} is already suspended" in again.stdout, again.stdout

        assert rubick("resume", job_id, "--data-dir", str(rk)).returncode == 0
        until_status(rk, job_id, "running")

        prio = rubick("priority", job_id, "20", "--data-dir", str(rk), "--reason", "deadline")
        assert prio.returncode == 0 and "priority set to 20" in prio.stdout, prio.stdout + prio.stderr
        bad = rubick("priority", job_id, "5000", "--data-dir", str(rk))
        assert bad.returncode == 2 and "priority: out of range (expected <= 1000, got 5000)" in bad.stderr
        line = next(x for x in rubick("status", "--data-dir", str(rk)).stdout.splitlines() if x.split()[:1] == [job_id])
        assert "prio 20" in line, line

        other = rubick("cancel", job_id, "--data-dir", str(rk), "--tenant", "team-z")
        assert other.returncode == 1 and "belongs to another tenant" in other.stdout and "data.tenant" in other.stdout
        assert rubick("cancel", job_id, "--data-dir", str(rk), "--tenant", "team-b").returncode == 0
        until_status(rk, job_id, "cancelled")
        late = rubick("cancel", job_id, "--data-dir", str(rk))
        assert late.returncode == 1 and "is already cancelled" in late.stdout
        unknown = rubick("resume", "no-such-job", "--data-dir", str(rk))
        assert unknown.returncode == 1 and "unknown job" in unknown.stdout

        # quotas, live: set one, refused ones, and the table with what each tenant's guaranteed jobs hold
        ok = rubick("quota", "set", "team-b", "4", "--data-dir", str(rk), "--reason", "test")
        assert ok.returncode == 0 and "quota of team-b: 4 GPUs" in ok.stdout, ok.stdout + ok.stderr
        typo = rubick("quota", "set", "team-bb", "4", "--data-dir", str(rk))
        assert typo.returncode == 1 and "unknown tenant" in typo.stdout and "data.tenant" in typo.stdout
        big = rubick("quota", "set", "team-b", "99", "--data-dir", str(rk))
        assert big.returncode == 1 and "more GPUs than the cluster has" in big.stdout
        assert rubick("quota", "set", "team-b", "-1", "--data-dir", str(rk)).returncode == 2
        shown = rubick("quota", "show", "--data-dir", str(rk))
        assert shown.returncode == 0 and any(line.split()[:2] == ["team-b", "4"] for line in shown.stdout.splitlines())
        half = rubick("quota", "set", "team-b", "50%", "--data-dir", str(rk))
        assert half.returncode == 0 and "0.5 of the cluster's GPUs" in half.stdout, half.stdout + half.stderr
        shown = rubick("quota", "show", "--data-dir", str(rk)).stdout
        assert any(line.split()[:2] == ["team-b", "4"] and "0.5 of the cluster" in line for line in shown.splitlines())
        assert rubick("quota", "set", "team-b", "150%", "--data-dir", str(rk)).returncode == 2
    finally:
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=60)

    replay = rubick("replay", str(rk / "events"))
    assert replay.returncode == 0 and "OK" in replay.stdout, replay.stdout + replay.stderr
    decided = rubick("log", "show", str(rk / "events"), "--subject", "plan.decided", "-n", "0", "--json")
    reasons = [d["reason"] for line in decided.stdout.splitlines()
               for d in json.loads(line)["payload"]["decisions"] if d["job_id"] == job_id]
    assert "suspended" in reasons and "cancelled" in reasons and reasons.index("suspended") < reasons.index("cancelled")
