"""kill -9 of `rubick up` (a real process, its embedded nats-server, recorder and services) in the middle of a
stream of acknowledged events, then a restart on the same data folder and port: every acknowledged event is
in the event log exactly once, no nats-server is left on the store, and the run replays."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


from controlplane.auth import Identity, find_credentials
from controlplane.bus.nats import JetStreamBus
from controlplane.cli import main
from controlplane.client import submission
from controlplane.eventlog import scan
from controlplane.events import encode, make
from controlplane.lifetime import pid_alive
from controlplane.natsserver import free_port, servers_on

from .samples import PAYLOADS

N = 300
KILL_AT = 120


def start_up(data_dir: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "up", "--data-dir", str(data_dir),
                             "--port", str(port), "--metrics-port", "-1", "--tick-period", "0",
                             "--roll-seconds", "0.3"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines = [proc.stdout.readline()]
    while "ready in" not in lines[-1] and lines[-1] and len(lines) < 40:
        lines.append(proc.stdout.readline())
    assert "ready in" in lines[-1], "".join(lines)
    return proc


def events(i: int):
    """A metrics.iteration, and every tenth a job submission, with ids known to the test."""
    if i % 10 == 0:
        job = PAYLOADS["job.submitted"]
        e = submission(type(job)(**{**job.__dict__, "job_id": f"k9-job-{i}"}), event_id=f"k9-sub-{i}")
    else:
        e = make("metrics.iteration", PAYLOADS["metrics.iteration"], time=time.time(), id=f"k9-{i}", source="test")
    return e


async def publish_until_acked(bus: JetStreamBus, e, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await bus.publish(e.subject, encode(e), e.id, timeout=1.0, retries=0)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_kill_9_of_up_loses_no_acknowledged_event(tmp_path):
    data_dir, port = tmp_path / "rk", free_port()
    store = data_dir / "nats" / "jetstream"
    procs = [start_up(data_dir, port)]
    acked: list[str] = []
    try:
        bus = await JetStreamBus.connect(f"nats://127.0.0.1:{port}", create_stream=False,
                                         credentials=find_credentials(Identity("admin"), data_dir=data_dir))
        try:
            for i in range(N):
                if i == KILL_AT:
                    first_server = servers_on(store)
                    os.kill(procs[0].pid, signal.SIGKILL)
                    procs[0].wait()
                    procs.append(start_up(data_dir, port))  # the same port, just left by the dying server
                e = events(i)
                await publish_until_acked(bus, e)
                acked.append(e.id)
        finally:
            await bus.close()
        assert len(first_server) == 1 and not pid_alive(first_server[0]), "the first server outlived its owner"
        assert len(servers_on(store)) == 1
        procs[-1].send_signal(signal.SIGTERM)
        out, _ = procs[-1].communicate(timeout=60)
        assert procs[-1].returncode == 0, out
        assert "stopped:" in out
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert servers_on(store) == [], "a nats-server still runs on the store"
    ids = scan(data_dir / "events", ["msg_id"]).frame["msg_id"].to_list()
    assert len(ids) == len(set(ids)), "duplicate rows in the event log"
    missing = set(acked) - set(ids)
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged events missing, e.g. {sorted(missing)[:3]}"
    assert main(["replay", str(data_dir / "events")]) == 0
