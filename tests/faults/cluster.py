"""kill -9 of one server of a three-server JetStream cluster while a client publishes as fast as the stream
acknowledges.

Three real nats-servers on 127.0.0.1 form one JetStream cluster (harness.Nats: routes on loopback, each its
own store); once it has a meta leader the deployment's bootstrap makes the stream and the lease bucket with
3 replicas, and the real recorder (`rubick service recorder`, given all three URLs) writes the stream into
Parquet. A client publishes `n` measured iterations (the project's events and encoding, each with its id as
Nats-Msg-Id) with asynchronous publishes, acknowledgements collected per chunk; in the middle of a chunk one
server is killed with SIGKILL: a follower of the stream (the publisher's own server where it is one, so the
client fails over), the stream's leader, or the publisher's own server whatever it is. Publishing goes on: a
publish not acknowledged in time counts as a failure and is published again with the same id, so JetStream
stores it once. At the end the events acknowledged just before the kill are published again with their ids,
as a client that lost their acknowledgements would: the stream must answer each as a duplicate (its
de-duplication survived the kill and any change of leader).

Checked afterwards, from the log read back with `controlplane.eventlog.scan`: every published event is in the
log exactly once (none lost, none twice, whether by id or by stream sequence), the log holds sequences
1..last without a gap, the stream holds exactly `n` messages, and the log passes its manifest check
(`controlplane.eventlog.check`).

Used by tests/faults/test_cluster.py and bench/nats_cluster.py."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from urllib.parse import urlparse

import polars as pl

from controlplane.bus.nats import MSG_ID, JetStreamBus
from controlplane.eventlog import check as check_manifest
from controlplane.eventlog import scan
from controlplane.events import encode

from .harness import Deployment, measured

KILLS = ("follower", "leader", "publisher")
"""Which server is killed: a follower of the stream (preferably the one the publisher is connected to), the
stream's leader, or the server the publisher is connected to (whichever it is: the client must fail over)."""


@dataclass
class ClusterOutcome:
    kill: str
    events: int
    killed: str = ""
    leader: str = ""
    """The stream's leader before the kill, and after it."""
    leader_after: str = ""
    connected: str = ""
    """The server the publisher was connected to when the kill came."""
    connected_after: str = ""
    publish_failures: int = 0
    """Publishes not acknowledged in time (or answered with an error), published again with the same id."""
    retried_duplicates: int = 0
    """Of those, how many the stream answered as duplicates (it had stored the first publish)."""
    resent: int = 0
    """Events acknowledged just before the kill, published again with their ids after it (as a client that
    lost their acknowledgements would)..."""
    resent_duplicates: int = 0
    """... and how many of them the stream answered as duplicates (all, when de-duplication survived the kill)."""
    publish_rate: float = 0.0
    """Events per second from the first publish to the last acknowledgement (the kill included)."""
    recover_s: float = math.nan
    """From the kill until the first acknowledgement of a publish sent after it."""
    stall_s: float = 0.0
    """The longest time without any acknowledgement while publishing."""
    recorded_s: float = math.nan
    """From the kill until the last event was in a Parquet file."""
    stream_messages: int = 0
    rows: int = 0
    """Rows in the log's files (before any de-duplication)."""
    lost: int = 0
    duplicated: int = 0
    gaps: int = 0
    manifest_problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    log: Path | None = None
    last_seq: int = 0

    @property
    def survived(self) -> bool:
        return (not (self.lost or self.duplicated or self.gaps or self.manifest_problems)
                and self.stream_messages == self.events == self.rows and self.resent_duplicates == self.resent)


def _stamp(acked_at: list[float], i: int, fut: asyncio.Future) -> None:
    if not fut.cancelled() and fut.exception() is None:
        acked_at[i] = time.monotonic()


def server_of(d: Deployment, url: str | None) -> str:
    """The name of the cluster's server listening at `url` ("" when none)."""
    port = urlparse(url or "").port if url else None
    return next((s.server_name for s in d.nats.servers if s.port == port), "")


async def stream_leader(bus: JetStreamBus, timeout: float = 30.0) -> str:
    """The stream's leader now (once it has one)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            info = await bus.js.stream_info(bus.stream)
            if info.cluster and info.cluster.leader:
                return info.cluster.leader
        except Exception:  # an election under way
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"the stream {bus.stream} has no leader")
        await asyncio.sleep(0.1)


async def stream_messages(bus: JetStreamBus, attempts: int = 20) -> int:
    """Messages in the stream (asked again while a cluster that just lost a server is slow to answer)."""
    for attempt in range(attempts):
        try:
            return int((await bus.js.stream_info(bus.stream)).state.messages)
        except Exception:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.5)
    raise AssertionError("unreachable")


async def target(d: Deployment, kill: str) -> str:
    """The name of the server to kill."""
    leader = await stream_leader(d.bus)
    if kill == "leader":
        return leader
    connected = server_of(d, d.bus.nc.connected_url.geturl() if d.bus.nc.connected_url else None)
    if kill == "publisher":
        return connected
    followers = [s.server_name for s in d.nats.servers if s.server_name != leader]
    return connected if connected in followers else followers[0]


async def publish_through_kill(d: Deployment, items: list[tuple[str, bytes, str]], kill_at: int, kill: str,
                               outcome: ClusterOutcome, chunk: int = 500, timeout: float = 1.0,
                               resend: int = 100) -> float:
    """Publish every item (async publishes, acks collected per chunk); before item `kill_at` is sent, kill -9
    the `kill` server. A publish not acknowledged in time is published again with the same id until the
    stream acknowledges it. At the end, the `resend` items acknowledged last before the kill are published
    again with their ids (the stream must answer duplicate). Returns the wall-clock time of the kill."""
    bus = d.bus
    n = len(items)
    acked_at = [0.0] * n
    t_kill = t_kill_wall = 0.0
    t0 = time.monotonic()
    for start in range(0, n, chunk):
        futures: list[asyncio.Future | None] = []
        for i in range(start, min(n, start + chunk)):
            if i == kill_at:
                name = await target(d, kill)
                outcome.killed, outcome.leader = name, await stream_leader(d.bus)
                outcome.connected = server_of(d, bus.nc.connected_url.geturl() if bus.nc.connected_url else None)
                t_kill, t_kill_wall = time.monotonic(), time.time()
                d.nats.kill(d.nats.named(name))
            subject, data, msg_id = items[i]
            try:
                fut = await bus.js.publish_async(subject, data, headers={MSG_ID: msg_id})
                fut.add_done_callback(partial(_stamp, acked_at, i))
            except Exception:  # not even sent (the connection is being replaced): published again below
                fut = None
            futures.append(fut)
        live = [f for f in futures if f is not None]
        if live:
            await asyncio.wait(live, timeout=timeout)
        for i, fut in enumerate(futures, start):
            if fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None:
                continue
            if fut is not None and not fut.done():
                fut.cancel()
            outcome.publish_failures += 1
            subject, data, msg_id = items[i]
            ack = await bus.publish(subject, data, msg_id, timeout=2.0, retries=60)  # the same id: stored once
            acked_at[i] = time.monotonic()
            outcome.retried_duplicates += ack.duplicate
    outcome.publish_rate = n / (max(acked_at) - t0)
    after = [acked_at[i] for i in range(kill_at, n)]
    outcome.recover_s = min(after) - t_kill
    stamps = sorted(acked_at)
    outcome.stall_s = max((b - a for a, b in zip(stamps, stamps[1:])), default=0.0)
    outcome.connected_after = server_of(d, bus.nc.connected_url.geturl() if bus.nc.connected_url else None)
    for subject, data, msg_id in items[max(0, kill_at - resend):kill_at]:
        ack = await bus.publish(subject, data, msg_id, timeout=2.0, retries=60)
        outcome.resent += 1
        outcome.resent_duplicates += ack.duplicate
    return t_kill_wall


async def run_cluster_kill(tmp: Path, n: int = 2000, kill: str = "follower", chunk: int = 500,
                           roll_seconds: float = 0.2) -> ClusterOutcome:
    """Deploy three servers and the recorder, publish `n` events with kill -9 of one server in the middle,
    wait until the recorder has everything, stop, check the log."""
    if kill not in KILLS:
        raise ValueError(f"unknown kill {kill!r}: one of {KILLS}")
    d = Deployment(tmp, nats_size=3, services=("recorder",))
    outcome = ClusterOutcome(kill, n)
    t0 = time.time()
    items = [(e.subject, encode(e), e.id) for e in (measured(i + 1, t0) for i in range(n))]
    await d.start()
    try:
        t_kill = await publish_through_kill(d, items, n // 2, kill, outcome, chunk)
        outcome.leader_after = await stream_leader(d.bus)
        try:
            last = await d.settled()
        except AssertionError as exc:  # checked all the same: what the log lacks is counted lost
            outcome.notes.append(str(exc))
            last = await d.bus.last_seq()
        outcome.stream_messages = await stream_messages(d.bus)
        said = [line for p in d.procs["recorder"] for line in p.lines if "recorder ready" not in line]
        outcome.notes += [f"recorder: {line[:300]}" for line in said[-5:]]
    finally:
        await d.stop()
    outcome.log, outcome.last_seq = d.log, last
    check_log(d.log, {msg_id for _, _, msg_id in items}, last, outcome)
    files = list(d.log.glob("events-*.parquet"))
    if files:
        outcome.recorded_s = max(f.stat().st_mtime for f in files) - t_kill
    return outcome


def published_ids(n: int) -> set[str]:
    """The ids of the events a run of `n` publishes."""
    return {measured(i + 1, 0.0).id for i in range(n)}


def check_log(log: Path, published: set[str], last: int, outcome: ClusterOutcome) -> ClusterOutcome:
    """Lost, duplicated (by id, or a sequence in two rows), gaps and the manifest check of the log, against
    the ids `published` and the stream's `last` sequence."""
    result = scan(log, ["msg_id"])
    ids, seqs = result.frame["msg_id"].to_list(), result.frame["seq"].to_list()
    outcome.rows = sum(pl.scan_parquet(f).select(pl.len()).collect().item() for f in result.files)
    outcome.lost = len(published - set(ids))
    outcome.duplicated = (len(ids) - len(set(ids))) + (outcome.rows - len(seqs))
    outcome.gaps = len(set(range(1, last + 1)) - set(seqs))
    extra = set(ids) - published
    if extra:
        outcome.notes.append(f"{len(extra)} event(s) in the log that were not published: {sorted(extra)[:5]}")
    outcome.manifest_problems = [f"{p.name}: {why}" for p, why in [*result.problems, *check_manifest(log)]]
    return outcome
