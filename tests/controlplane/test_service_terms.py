"""A service process whose lease is lost and taken again (NATS away for a while, its event loop busy) starts a
new term: it rebuilds its core from the stream, but describes it (`run.described`) only once. Its description's
id is a digest, so a second publish is dropped only within the stream's de-duplication window; past it the same
event would be stored twice. The stream here has a window of 0.2 s, so that the second term comes after it.
Real nats-server, real lease bucket, the admission service's real core."""

from __future__ import annotations

import asyncio

from controlplane.bus.nats import JetStreamBus
from controlplane.cli import build_parser
from controlplane.cli.service import _Term
from controlplane.lease import Lease, bucket_terms, ensure_lease_bucket


async def described(bus: JetStreamBus) -> list[str]:
    return [d.msg_id async for d in bus.read(["run.described"])]


async def test_a_later_term_of_the_same_process_does_not_describe_its_core_again(nats_server):
    bus = await JetStreamBus.connect(nats_server.url, dedupe_window=0.2)
    try:
        kv = await ensure_lease_bucket(bus.js, 2.0)
        args = build_parser().parse_args(["service", "admission", "--nats-url", nats_server.url])
        term = _Term(args, nats_server.url, bus)
        for _ in range(2):  # two terms of one process, each with the lease taken afresh
            lease = Lease(kv, "admission", "test", await bucket_terms(kv))
            assert await lease.try_acquire()
            stop = asyncio.Event()
            stop.set()  # the term ends as soon as its shell has rebuilt the core
            await term(stop, lease)
            await lease.release()
            await asyncio.sleep(0.5)  # past the de-duplication window
        ids = await described(bus)
        assert len(ids) == 1 and ids[0].startswith("run-admission-"), ids
    finally:
        await bus.close()
