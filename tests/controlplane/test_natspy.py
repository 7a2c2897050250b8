"""nats-py is imported without aiohttp (`controlplane.bus.natspy`): a command that talks to NATS does not pay for
aiohttp's import, and a `ws://` URL still works, through a real nats-server's WebSocket listener."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from controlplane.natsserver import NatsServer, free_port

REPO = Path(__file__).resolve().parents[2]

CLIENT = """
import asyncio, sys
import controlplane.client  # nats-py, by way of controlplane.bus.natspy
before = "aiohttp" in sys.modules or "multidict" in sys.modules
import nats

async def main():
    nc = await nats.connect(sys.argv[1], connect_timeout=5, max_reconnect_attempts=0)
    sub = await nc.subscribe("ws.check")
    await nc.publish("ws.check", b"over a websocket")
    msg = await sub.next_msg(timeout=5)
    await nc.close()
    import aiohttp, nats.aio.transport as transport  # the stand-in gave its place to the module at its first use
    print(before, msg.data.decode(), transport.aiohttp is aiohttp)

asyncio.run(main())
"""


def test_a_websocket_url_connects_and_loads_aiohttp_only_then(tmp_path):
    """Imported through the control plane, nats-py has not loaded aiohttp; a `ws://` URL connects, publishes and
    receives, and aiohttp is loaded then, in the stand-in's place."""
    port = free_port()
    conf = tmp_path / "websocket.conf"
    conf.write_text(f'websocket {{\n  listen: "127.0.0.1:{port}"\n  no_tls: true\n}}\n')
    server = NatsServer(tmp_path / "nats", config_file=conf).start()
    try:
        done = subprocess.run([sys.executable, "-c", CLIENT, f"ws://127.0.0.1:{port}"], cwd=REPO,
                              capture_output=True, text=True, timeout=60, check=False)
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "False over a websocket True"


def test_nats_py_imported_first_is_left_as_it_is():
    """Where nats-py was imported before the control plane, its transport keeps what it bound itself."""
    code = ("import nats.aio.transport as t\nimport aiohttp\nimport controlplane.client\n"
            "print(t.aiohttp is aiohttp)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.strip() == "True", done.stderr[-2000:]
