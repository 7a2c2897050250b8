"""The reporter publishes `metrics.iteration` without ever holding training up, and catches up
when NATS comes back."""

from __future__ import annotations

import time

from controlplane.bus.nats import JetStreamBus
from controlplane.events import Plan, decode
from controlplane.natsserver import NatsServer, free_port
from agents.reporter import Reporter


def make_reporter(url: str, **kw) -> Reporter:
    return Reporter(job_id="j1", model_type="gpt2", plan=Plan(dp=2), gpus_per_node=(2,), nats_url=url, node="n0", **kw)


async def stored(url: str) -> list:
    bus = await JetStreamBus.connect(url)
    try:
        return [decode(d.data, d.subject) async for d in bus.read(("metrics.iteration", "metrics.iteration.>"))]
    finally:
        await bus.close()


async def test_steps_and_phases_are_published(js_bus, nats_server):
    reporter = make_reporter(nats_server.url)
    for it in range(3):
        with reporter.step(it):
            with reporter.phase("fwd"):
                time.sleep(0.002)
            with reporter.phase("bwd"):
                time.sleep(0.004)
    reporter.close(timeout=10)
    events = await stored(nats_server.url)
    assert [e.payload.iteration for e in events] == [0, 1, 2]
    for e in events:
        x = e.payload
        assert x.job_id == "j1" and x.plan == Plan(dp=2) and x.gpus_per_node == (2,) and x.node == "n0"
        assert x.fwd_s >= 0.002 and x.bwd_s >= 0.004 and x.opt_s is None
        assert x.iter_time_s >= x.fwd_s + x.bwd_s


async def test_buffers_while_nats_is_away_and_catches_up(tmp_path):
    port = free_port()
    reporter = make_reporter(f"nats://127.0.0.1:{port}", buffer=50)
    t0 = time.perf_counter()
    for it in range(60):
        reporter.report(it, 0.01)
    assert time.perf_counter() - t0 < 1.0, "reporting must not wait for NATS"
    assert reporter.pending == 50 and reporter.dropped == 10
    server = NatsServer(tmp_path / "nats", port=port).start()
    try:
        bus = await JetStreamBus.connect(server.url)  # creates the stream
        await bus.close()
        reporter.close(timeout=20)
        events = await stored(server.url)
        assert sorted(e.payload.iteration for e in events) == list(range(10, 60))
        assert reporter.pending == 0
    finally:
        server.stop()
