"""3D plans end to end on the CPU: `rubick up` (a real nats-server, admission, modeler, the Rubick policy,
the recorder) and `rubick agent --cpu-devices 4` running the example trainer. The policy decides a
tensor-parallel plan for a LLaMA-7B job on the 4-device node (its fitted curve makes TP 4 the fastest there),
the agent runs it on torch's TP modules; a guaranteed job then takes two devices, the policy moves the first
job to another plan on the two left (a data-parallel ZeRO-Offload plan on DeepSpeed), the agent checkpoints
and resumes it across the change, both jobs complete, and `rubick replay` reproduces every decision."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from controlplane.eventlog import events as log_events

from .helpers import REPO, kill_jobs, stop_agent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

BIG = {"job_id": "llama-3d", "tenant": "team-b", "model": {"type": "llama7"}, "global_batch_size": 8,
       "plan": {"dp": 4}, "resources": {"gpus": 4, "cpus": 4}, "target_iterations": 60}
SMALL = {"job_id": "bert-g", "tenant": "team-a", "guaranteed": True, "model": {"type": "bert"},
         "global_batch_size": 32, "plan": {"dp": 2}, "resources": {"gpus": 2, "cpus": 2}, "target_iterations": 20}


def rubick(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controlplane.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def recorded(rk: Path) -> list:
    """Every event recorded so far (the recorder rolls its Parquet files every 0.2 s)."""
    if not (rk / "events").is_dir():
        return []
    return list(log_events(rk / "events").events)


def until(rk: Path, what, timeout: float, said: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what(recorded(rk))
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"no {said} in {timeout} s: " + ", ".join(e.subject for e in recorded(rk))[-2000:])


def test_the_policy_decides_3d_the_agent_runs_and_moves_it_and_replay_agrees(tmp_path):
    rk, state = tmp_path / "rk", tmp_path / "agent"
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for doc in (BIG, SMALL):
        (jobs / f"{doc['job_id']}.yaml").write_text(yaml.safe_dump(doc))
    up = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "up", "--data-dir", str(rk), "--port", "0",
                           "--metrics-port", "-1", "--tick-period", "1", "--roll-seconds", "0.2"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    agent = None
    try:
        assert "ready in" in up.stdout.readline()
        url = json.loads((rk / "endpoints.json").read_text())["nats_url"]
        agent = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "agent", "--data-dir", str(rk),
                                  "--nats-url", url, "--node", "n0", "--cpu-devices", "4", "--cpus", "8",
                                  "--mem-gb", "24", "--size", "small", "--state-dir", str(state),
                                  "--heartbeat", "0.5", "--log-level", "warning"],
                                 cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        while "ready" not in (line := agent.stdout.readline()):
            assert line, "the agent ended before it was ready"
        assert rubick("submit", str(jobs / "llama-3d.yaml"), "--data-dir", str(rk)).returncode == 0

        started = until(rk, lambda es: [e for e in es if e.base == "job.started" and e.payload.job_id == "llama-3d"],
                        240, "job.started of llama-3d")
        first = started[0].payload.plan
        assert first.tp > 1 or first.pp > 1, f"the policy decided {first.code()}, not a 3D plan"
        until(rk, lambda es: [e for e in es if e.base == "metrics.iteration" and e.payload.job_id == "llama-3d"
                              and e.payload.plan == first], 240, "iterations under the 3D plan")

        assert rubick("submit", str(jobs / "bert-g.yaml"), "--data-dir", str(rk)).returncode == 0
        done = until(rk, lambda es: {e.payload.job_id for e in es if e.base == "job.completed"} >= {"llama-3d", "bert-g"}
                     and es, 420, "both completions")
        moved = [e.payload.plan for e in done if e.base == "job.reconfigured" and e.payload.job_id == "llama-3d"]
        assert moved and any(p != first for p in moved), "a later decision moved the 3D job to another plan"
        assert not [e for e in done if e.base == "job.failed"], [e.payload for e in done if e.base == "job.failed"]
        assert not [e for e in done if e.base == "plan.rejected"]
        ran = {e.payload.plan for e in done if e.base == "metrics.iteration" and e.payload.job_id == "llama-3d"}
        assert first in ran and any(p != first for p in ran), "it trained under both plans"
        print(f"\nllama-3d: started under {first.code()}, moved to {', '.join(p.code() for p in moved)}")
    finally:
        if agent is not None:
            stop_agent(agent)
        kill_jobs(state)
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=60)
    check = rubick("replay", str(rk / "events"), timeout=300)
    assert check.returncode == 0 and "every recorded decision was reproduced" in check.stdout, check.stdout + check.stderr
