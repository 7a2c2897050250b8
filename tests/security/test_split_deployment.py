"""A deployment of separate `rubick service` processes, each with its own role's credentials only (as on
Kubernetes), against a real nats-server that requires them: the services wait until the bootstrap identity
has created the stream and the lease bucket, and then every service does its work with no permission refused; a submitter's
bad job is answered, a node's registration and a job's submission lead to a decision, and the log
holds it all."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.auth import AuthStore, Credentials, Identity
from controlplane.bus.nats import JetStreamBus
from controlplane.cli import main
from controlplane.client import Client
from controlplane.eventlog import scan
from controlplane.events import Plan, encode, make
from controlplane.natsserver import NatsServer

from ..faults.harness import Proc
from ..policy.helpers import job, node
from ..replay.test_replicas import Replica

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


async def test_every_service_works_with_only_its_roles_permissions(tmp_path, capsys):
    store = AuthStore(tmp_path / "auth")
    store.init()
    store.add(Identity("agent", "n0"))
    store.add(Identity("agent", "n1"))
    server = NatsServer(tmp_path / "nats", config_file=store.write_server_config()).start()
    replicas: list[Replica] = []
    early_agent: Proc | None = None
    try:
        # the services start first and wait, as on Kubernetes, where the chart's bootstrap Job runs after them
        for name in ("recorder", "admission", "clock", "modeler", "policy"):
            extra = ["--log-dir", str(tmp_path / "events"), "--roll-seconds", "0.3"] if name == "recorder" else \
                ["--tick-period", "1"] if name == "clock" else []
            replicas.append(Replica(server.url, name, "--creds", str(store.seed_file(Identity(name))), *extra))
        early_agent = Proc("agent", ["agent", "--nats-url", server.url, "--node", "n1", "--cpu-devices", "1",
                                     "--creds", str(store.seed_file(Identity("agent", "n1"))),
                                     "--state-dir", str(tmp_path / "agent-n1"), "--log-level", "warning"])
        for r in replicas:
            await r.said("waiting for the deployment's bootstrap", timeout=120)
        await early_agent.said("agent n1 waiting for the deployment's bootstrap", timeout=120)
        assert all(r.proc.poll() is None for r in replicas), "a service waits for the bootstrap, it does not exit"
        assert early_agent.proc.poll() is None, "so does an agent"
        assert await asyncio.to_thread(main, ["auth", "bootstrap", "--nats-url", server.url,
                                              "--creds", str(store.seed_file(Identity("admin")))]) == 0
        assert "stream RUBICK ready" in capsys.readouterr().out
        for r in replicas:
            await r.said("ready", timeout=120)
        await early_agent.said("agent n1 ready", timeout=120)
        early_agent.stop()

        agent = await JetStreamBus.connect(server.url, create_stream=False,
                                           credentials=Credentials(store.seed_file(Identity("agent", "n0"))))
        await agent.publish("node.registered.n0", encode(
            make("node.registered.n0", node("n0"), time=1.0, id="reg-n0", source="agent-n0")))
        submitter = Credentials(store.seed_file(Identity("submitter")))
        async with await Client.connect(server.url, credentials=submitter) as client:
            ok = await client.submit(job("good", "vit", 64, Plan(dp=2), 2, 16),
                                     wait_s=30)
            assert ok.rejected is None
            bad = await client.submit(job("bad", "no-such-model", 64, Plan(dp=2), 2, 16),
                                      wait_s=30)
            assert bad.rejected is not None and "unknown model" in bad.rejected.reason
        await agent.close()

        async def logged() -> set[str]:
            try:
                return set(scan(tmp_path / "events").frame["subject"].to_list())
            except Exception:
                return set()
        for _ in range(300):
            subjects = await logged()
            if {"plan.decided", "run.described", "clock.tick", "job.rejected", "node.registered.n0"} <= subjects:
                break
            await asyncio.sleep(0.1)
        assert {"plan.decided", "run.described", "clock.tick", "job.rejected", "node.registered.n0"} <= subjects
    finally:
        if early_agent is not None:
            early_agent.stop()
        for r in replicas:
            r.proc.terminate()
        for r in replicas:
            try:
                r.proc.wait(30)
            except Exception:
                r.proc.kill()
        server.stop()
    said = "\n".join(line for r in replicas for line in r.lines)
    assert "ermissions violation" not in said and "Traceback" not in said, said
