"""A service's term that fails because NATS went away for longer than its lease stands the replica by
(it takes the lease again and rebuilds when NATS is back) instead of ending the service; a term that
fails while its lease is still held is a fault of its own and still ends it. Real nats-server."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from controlplane.lease import Lease, bucket_terms, ensure_lease_bucket, run_replicated

TTL = 1.0


async def test_a_publish_that_gives_up_after_the_lease_was_lost_stands_by_and_a_held_one_raises(js_bus):
    kv = await ensure_lease_bucket(js_bus.js, TTL)
    lease = Lease(kv, "modeler", "replica-a", await bucket_terms(kv))
    terms = 0

    async def term(term_stop: asyncio.Event, held: Lease) -> None:
        nonlocal terms
        terms += 1
        if terms == 1:  # the server is away: renewals stop, the lease runs out, then the publish gives up
            held.valid_until = 0.0
            raise nats.errors.TimeoutError
        if terms == 2:  # the lease is held: this failure is the term's own
            raise ValueError("a fault of the term")

    with pytest.raises(ValueError, match="a fault of the term"):
        await asyncio.wait_for(run_replicated(lease, term, asyncio.Event()), 10 * TTL)
    assert terms == 2, "the replica should have stood by and taken the lease again after the first term"
