"""`rubick auth` against a running, secure `rubick up`: an agent added while it runs can connect at once
(the server reloaded its configuration), and the folder's listing and the permission printout say what
the code enforces."""

from __future__ import annotations

import asyncio
import json

import pytest

from controlplane.auth import AuthError, AuthStore, Credentials
from controlplane.bus.nats import JetStreamBus
from controlplane.cli import main
from controlplane.runtime import ControlPlane, UpConfig


async def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def test_add_an_agent_to_a_running_control_plane(tmp_path, capsys):
    data = tmp_path / "rk"
    plane = await ControlPlane(UpConfig(data_dir=data, nats_port=0, metrics_port=-1, tick_period_s=0)).start()
    try:
        seed = data / "auth" / "agent-gpu-7.nk"
        with pytest.raises(AuthError):  # not known yet
            await JetStreamBus.connect(plane.nats_url, create_stream=False, credentials=Credentials(seed))
        code, out, _ = await run(capsys, "auth", "add", "agent", "gpu-7", "--data-dir", str(data))
        assert code == 0 and "agent-gpu-7: created" in out and "reporter-gpu-7: created" in out
        assert "reloaded" in out and seed.read_text().startswith("SU")
        agent = await JetStreamBus.connect(plane.nats_url, create_stream=False, credentials=Credentials(seed))
        assert (await agent.publish("node.heartbeat.gpu-7", b"\x80", retries=0)).seq > 0
        with pytest.raises(PermissionError):
            await agent.publish("node.heartbeat.gpu-8", b"\x80", retries=0)
        await agent.close()

        code, out, _ = await run(capsys, "auth", "add", "agent", "gpu-7", "--data-dir", str(data))
        assert code == 0 and "agent-gpu-7: exists" in out  # idempotent: the seed is kept
        code, out, _ = await run(capsys, "auth", "list", "--json", "--data-dir", str(data))
        names = {row["identity"] for row in json.loads(out)}
        assert {"admin", "policy", "submitter", "agent-gpu-7", "reporter-gpu-7"} <= names
        code, _, err = await run(capsys, "auth", "add", "agent", "--data-dir", str(data))
        assert code == 2 and "needs node" in err
    finally:
        await plane.stop()


async def test_permissions_printout_and_a_folder_for_a_deployment(tmp_path, capsys):
    code, out, _ = await run(capsys, "auth", "permissions", "agent", "gpu-7")
    assert code == 0 and "job.completed.gpu-7" in out and "plan.decided" not in out
    code, out, _ = await run(capsys, "auth", "permissions", "recorder")
    assert code == 0 and "publishes: nothing" in out
    code, out, _ = await run(capsys, "auth", "init", "--dir", str(tmp_path / "creds"), "--agents", "g0", "g1")
    assert code == 0
    store = AuthStore(tmp_path / "creds")
    assert {"agent-g0", "reporter-g1", "admin"} <= set(store.users())
    assert store.users()["agent-g0"] in store.server_config.read_text()
