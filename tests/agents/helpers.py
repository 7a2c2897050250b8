"""Helpers for the agent tests: an agent process, a live event watcher, events to publish, the training processes a
test started, and one job launched by a local launcher."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from agents.core import Launch
from agents.launcher import LocalLauncher, read_json
from agents.plan_check import JobInfo
from controlplane.events import (Decision, Event, Invalid, JobSubmitted, ModelRef, NodeShare, Plan, PlanDecided,
                                 Resources, decode, encode, make)
from controlplane.lifetime import cmdline, parent_pid, pids_running

REPO = Path(__file__).resolve().parents[2]


def start_agent(url: str, state_dir: Path, node: str = "n0", cpu_devices: int = 2, *extra: str) -> subprocess.Popen:
    """`rubick agent` in its own process; returns once it printed that it is ready."""
    proc = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "agent", "--nats-url", url, "--node", node,
                             "--cpu-devices", str(cpu_devices), "--state-dir", str(state_dir), "--heartbeat", "0.5",
                             "--log-level", "warning", *extra],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "RUBICK_AGENT_LEASE_S": "60"})  # trainers left behind end soon
    line = proc.stdout.readline()
    assert "ready" in line, line + (proc.stdout.read() if proc.poll() is not None else "")
    return proc


def kill_jobs(state_dir: Path) -> None:
    """SIGKILL the process group of every job an agent launched under `state_dir` (what a test leaves)."""
    for record in sorted((Path(state_dir) / "jobs").glob("*/launch*.json")):
        try:
            os.killpg(int(json.loads(record.read_text())["pid"]), signal.SIGKILL)
        except (OSError, ValueError, KeyError, TypeError):
            continue


def stop_agent(proc: subprocess.Popen) -> str:
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out or ""


class Watcher:
    """Every event published from now on, decoded, once each, in arrival order. (A `>` subscription
    also sees the stream's deliveries to consumers, so copies are dropped by event id.)"""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.ids: set[str] = set()
        self.sub = None

    async def start(self, bus) -> "Watcher":
        async def on_msg(msg) -> None:
            try:
                event = decode(msg.data, msg.subject)
            except Invalid:
                return
            if event.id not in self.ids:
                self.ids.add(event.id)
                self.events.append(event)
        self.sub = await bus.nc.subscribe(">", cb=on_msg)
        return self

    def of(self, subject: str, job_id: str | None = None) -> list[Event]:
        return [e for e in self.events if e.base == subject
                and (job_id is None or getattr(e.payload, "job_id", None) == job_id)]

    async def until(self, what: Callable[[], object], timeout: float, message: str = "") -> object:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = what()
            if got:
                return got
            await asyncio.sleep(0.1)
        seen = [(e.subject, getattr(e.payload, "job_id", ""), *([e.payload.reason] if e.base.endswith(".rejected") else []))
                for e in self.events if not e.subject.startswith("node.h") and e.base != "metrics.iteration"]
        """what came, a refusal with its reason (a timeout under load is otherwise hard to read)"""
        raise AssertionError(f"timed out waiting for {message or what}; saw {seen}")


def job(job_id: str = "j1", *, gbs: int = 8, target: int = 100, plan: Plan = Plan(dp=2, zero_stage=2)) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, tenant="t", guaranteed=True, model=ModelRef(type="gpt2"), global_batch_size=gbs,
                        plan=plan, resources=Resources(gpus=plan.gpus), target_iterations=target)


def decision(job_id: str, plan: Plan | None, gpus: int, cpus: int = 0, node: str = "n0") -> Decision:
    return Decision(job_id=job_id, allocation=(NodeShare(node=node, gpus=gpus, cpus=cpus),) if gpus else (), plan=plan)


_n = 0


async def publish(bus, subject: str, payload) -> Event:
    global _n
    _n += 1
    event = make(subject, payload, time=time.time(), id=f"test-{_n}-{time.monotonic_ns()}", source="test")
    await bus.publish(subject, encode(event), event.id)
    return event


async def decide(bus, *decisions: Decision, subject: str = "plan.decided.n0", round: int = 1) -> Event:
    return await publish(bus, subject, PlanDecided(round=round, policy="test", decisions=tuple(decisions)))


# --- training processes started here, and one job launched by a local launcher ----------------------------
def started_here(tmp: Path) -> list[int]:
    """Processes whose command line names a path under `tmp` (the benchmark's torchrun and trainers)."""
    return pids_running(lambda args: any(str(tmp) in a for a in args))


def trainers(tmp: Path) -> list[int]:
    """The training processes torchrun started: those of `started_here` whose parent is torchrun (itself one of them,
    its command line naming the trainer). A worker started warm is a fork of torchrun and shows torchrun's command
    line, so the command line alone cannot tell them apart."""
    here = started_here(tmp)
    launchers = {p for p in here if "agents.torchrun" in cmdline(p) and "train.py" in " ".join(cmdline(p))}
    return [p for p in here if parent_pid(p) in launchers]


def wait_until(what, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(0.2)
    return False


def launch(launcher: LocalLauncher, attempt: int) -> None:
    share = NodeShare(node="n0", gpus=1, cpus=1)
    launcher.launch(Launch(job=JobInfo("lease-job", "example", 4, 1_000_000), plan=Plan(dp=1), allocation=(share,),
                           share=share, attempt=attempt, devices=(0,), cpu_cores=()))


def status(launcher: LocalLauncher) -> dict:
    return read_json(launcher.job_dir("lease-job") / "status.json") or {}


def poll_until(launcher: LocalLauncher, what, timeout: float = 180.0, polling: bool = True) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if polling:
            launcher.poll()
        st = status(launcher)
        if what(st):
            return st
        time.sleep(0.1)
    raise AssertionError(f"timed out; status {status(launcher)}")
