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


@pytest.mark.parametrize("service,failure", [
    # a replica busy with a backlog saw its lease lost while a renewal in flight then succeeded
    ("modeler", "lease lost"),
    # a recorder whose next term's first request timed out while its connection moved to another server
    ("recorder", "nats timeout"),
])
async def test_a_term_that_failed_while_the_lease_is_held_runs_again(js_bus, service, failure):
    """The term ended all the same: the replica runs a new one instead of exiting."""
    from controlplane.lease import LeaseLost

    kv = await ensure_lease_bucket(js_bus.js, TTL)
    lease = Lease(kv, service, "replica-a", await bucket_terms(kv))
    stop = asyncio.Event()
    terms = 0

    async def term(term_stop: asyncio.Event, held: Lease) -> None:
        nonlocal terms
        terms += 1
        if terms == 1:
            assert held.held()  # valid, yet the term gave up
            raise LeaseLost("seen lost while busy") if failure == "lease lost" else nats.errors.TimeoutError
        stop.set()

    await asyncio.wait_for(run_replicated(lease, term, stop), 10 * TTL)
    assert terms == 2, "the replica exited instead of running its term again"
