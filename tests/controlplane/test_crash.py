"""Crash tests: kill -9 the recorder, and kill -9 nats-server (store kept), in the middle of a stream of
100,000 acknowledged messages. Afterwards every acknowledged message is in the event log exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from controlplane.bus.nats import JetStreamBus
from controlplane.eventlog import scan
from controlplane.events import encode
from controlplane.natsserver import NatsServer
from controlplane.recorder.service import Recorder, RecorderConfig, stream_token

from .samples import sample

pytestmark = pytest.mark.slow

N = 100_000
CHUNK = 2_000


def start_recorder(url: str, log_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli", "service", "recorder", "--nats-url", url,
         "--log-dir", str(log_dir), "--roll-seconds", "0.3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [proc.stdout.readline()]  # a restart may first say which interrupted write it removed
    while "recorder ready" not in lines[-1] and lines[-1] and len(lines) < 20:
        lines.append(proc.stdout.readline())
    assert "recorder ready" in lines[-1], lines
    return proc


def messages(start: int, stop: int):
    wire = encode(sample("metrics.iteration"))
    return [("metrics.iteration", wire, f"crash-{i}") for i in range(start, stop)]


async def wait_recorded(log_dir: Path, count: int, timeout: float = 120.0) -> pl.DataFrame:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frame = scan(log_dir, ["msg_id"]).frame
        if frame.height >= count:
            return frame
        await asyncio.sleep(0.5)
    return scan(log_dir, ["msg_id"]).frame


def assert_exactly_once(frame: pl.DataFrame, acked: set[str]) -> None:
    ids = frame["msg_id"].to_list()
    assert len(ids) == len(set(ids)), "duplicate rows in the event log"
    missing = acked - set(ids)
    assert not missing, f"{len(missing)} acknowledged messages missing, e.g. {sorted(missing)[:3]}"
    seqs = frame["seq"].to_list()
    assert seqs == list(range(1, len(seqs) + 1)), "gaps or disorder in stream sequences"


async def test_recorder_killed_mid_stream(nats_server, tmp_path):
    log_dir = tmp_path / "events"
    bus = await JetStreamBus.connect(nats_server.url)
    recorder = start_recorder(nats_server.url, log_dir)
    acked: set[str] = set()
    killed = False
    try:
        for start in range(0, N, CHUNK):
            items = messages(start, start + CHUNK)
            acks = await bus.publish_many(items)
            acked.update(m for (_, _, m), a in zip(items, acks) if a.seq > 0)
            if not killed and start >= N * 2 // 5:
                recorder.send_signal(signal.SIGKILL)
                recorder.wait()
                killed = True
        recorder = start_recorder(nats_server.url, log_dir)
        frame = await wait_recorded(log_dir, N)
    finally:
        recorder.send_signal(signal.SIGTERM)
        recorder.wait(30)
        await bus.close()
    assert killed and len(acked) == N
    assert_exactly_once(frame, acked)
    assert frame.height == N


async def test_nats_server_killed_mid_stream(tmp_path):
    server = NatsServer(tmp_path / "nats").start()
    port = server.port
    log_dir = tmp_path / "events"
    bus = await JetStreamBus.connect(server.url)
    recorder = Recorder(bus, RecorderConfig(log_dir, roll_seconds=0.3), stream_token(await bus.stream_created()))
    stop = asyncio.Event()
    task = asyncio.create_task(recorder.run(stop))
    acked: set[str] = set()
    killed_at = None

    async def outage() -> None:
        nonlocal server
        server.kill()  # kill -9, store folder kept
        await asyncio.sleep(1.0)
        server = await asyncio.to_thread(NatsServer(tmp_path / "nats", port=port).start)

    restart = None
    try:
        for start in range(0, N, CHUNK):
            if killed_at is None and start >= N // 3:
                killed_at = start
                restart = asyncio.create_task(outage())  # dies while this chunk is in flight
            items = messages(start, start + CHUNK)
            acks = await bus.publish_many(items)
            acked.update(m for (_, _, m), a in zip(items, acks) if a.seq > 0)
        await restart
        frame = await wait_recorded(log_dir, N)
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        await bus.close()
        server.stop()
    assert killed_at is not None and len(acked) == N
    frame = scan(log_dir, ["msg_id"]).frame
    assert_exactly_once(frame, acked)
    assert frame.height == N


async def test_a_consumer_asked_for_its_lag_during_an_outage_says_unknown_and_recovers(tmp_path):
    """The recorder and every service read their consumer's lag every few seconds for a metric. A read
    that lands while the server is down used to raise out of their loop and stop them; it now answers
    None, and the real figure once the server is back."""
    server = NatsServer(tmp_path / "nats").start()
    port = server.port
    bus = await JetStreamBus.connect(server.url)
    try:
        await bus.publish_many(messages(0, 5))
        consumer = await bus.consumer("lagger", (">",))
        assert await consumer.lag() == 5
        server.kill()  # kill -9, store folder kept
        assert await consumer.lag() is None
        server = await asyncio.to_thread(NatsServer(tmp_path / "nats", port=port).start)
        deadline = time.monotonic() + 30
        lag = None
        while lag is None and time.monotonic() < deadline:
            lag = await consumer.lag()
            await asyncio.sleep(0.2)
        assert lag == 5
    finally:
        await bus.close()
        server.stop()
