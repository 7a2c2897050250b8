"""The embedded default is secure: `rubick up` creates an identity per component in its data folder, a
real `rubick agent` started beside it gets its own node's identity (and its reporter's) without a
restart of the server, and neither can speak for another node; the reporter reports with its node's
identity."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys

import pytest

from agents.reporter import Reporter
from controlplane.auth import AuthStore, Credentials, Identity, find_credentials
from controlplane.bus.nats import JetStreamBus
from controlplane.events import Plan, decode

from ..agents.helpers import REPO, Watcher

pytestmark = pytest.mark.timeout(180)


def start(*args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "controlplane.cli", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = [proc.stdout.readline()]
    while "ready" not in lines[-1] and lines[-1] and len(lines) < 20:
        lines.append(proc.stdout.readline())
    assert "ready" in lines[-1], "".join(lines) + (proc.stdout.read() if proc.poll() is not None else "")
    return proc


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()[0]


async def test_an_agent_beside_a_secure_up_speaks_only_for_its_node(tmp_path):
    data = tmp_path / "rk"
    up = start("up", "--data-dir", str(data), "--port", "0", "--metrics-port", "-1", "--tick-period", "0")
    agent = None
    try:
        endpoints = json.loads((data / "endpoints.json").read_text())
        url = endpoints["nats_url"]
        assert endpoints["auth_dir"] and "nkey" not in url
        admin = await JetStreamBus.connect(url, create_stream=False,
                                           credentials=find_credentials(Identity("admin"), data_dir=data))
        watch = await Watcher().start(admin)
        agent = await asyncio.to_thread(start, "agent", "--data-dir", str(data), "--node", "n0", "--cpu-devices", "2",
                                        "--heartbeat", "0.3", "--state-dir", str(tmp_path / "agent"),
                                        "--log-level", "warning")  # the watcher goes on reading meanwhile
        store = AuthStore(data / "auth")
        assert {"agent-n0", "reporter-n0"} <= set(store.users())  # created for it, the server reloaded
        await watch.until(lambda: watch.of("node.heartbeat"), 30, "a heartbeat")
        (reg,) = await watch.until(lambda: watch.of("node.registered"), 10, "the registration")
        assert reg.subject == "node.registered.n0" and reg.payload.node == "n0"

        as_agent = await JetStreamBus.connect(url, create_stream=False,
                                              credentials=Credentials(store.seed_file(Identity("agent", "n0"))))
        for forged in ("plan.decided", "job.completed.n1", "node.lost.n1", "model.updated", "job.submitted"):
            with pytest.raises(PermissionError):
                await as_agent.publish(forged, b"\x80", retries=0)
        await as_agent.close()

        reporter = Reporter(job_id="j1", model_type="gpt2", plan=Plan(dp=1), gpus_per_node=(1,), nats_url=url,
                            node="n0", credentials=Credentials(store.seed_file(Identity("reporter", "n0"))))
        reporter.report(0, 0.5)
        reporter.report(1, 0.5)
        reporter.close(timeout=20)
        assert reporter.published == 2
        stored = [decode(d.data, d.subject) async for d in admin.read(("metrics.iteration.>",))]
        assert [e.subject for e in stored] == ["metrics.iteration.n0"] * 2
        await admin.close()
    finally:
        if agent is not None:
            stop(agent)
        out = stop(up)
    assert up.returncode == 0, out
    assert "seed" not in out and "SU" not in out  # no secret printed
