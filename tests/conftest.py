"""Shared fixtures: a real nats-server (JetStream) on 127.0.0.1, started per test on a free port."""

from __future__ import annotations

import pytest

from controlplane.natsserver import NatsServer


@pytest.fixture
def nats_server(tmp_path):
    server = NatsServer(tmp_path / "nats").start()
    yield server
    server.stop()


@pytest.fixture
async def js_bus(nats_server):
    from controlplane.bus.nats import JetStreamBus

    bus = await JetStreamBus.connect(nats_server.url)
    yield bus
    await bus.close()
