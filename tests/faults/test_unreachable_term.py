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


async def test_a_term_ended_by_a_lost_lease_runs_again_even_where_a_late_renewal_made_it_valid(js_bus):
    """A replica busy handling a backlog saw its lease lost (LeaseLost) while a renewal in flight then
    succeeded: the term ended all the same, so the replica runs a new one instead of exiting."""
    from controlplane.lease import LeaseLost

    kv = await ensure_lease_bucket(js_bus.js, TTL)
    lease = Lease(kv, "modeler", "replica-a", await bucket_terms(kv))
    stop = asyncio.Event()
    terms = 0

    async def term(term_stop: asyncio.Event, held: Lease) -> None:
        nonlocal terms
        terms += 1
        if terms == 1:
            assert held.held()  # the renewal came back in time: valid again, yet the term had given up
            raise LeaseLost("seen lost while busy")
        stop.set()

    await asyncio.wait_for(run_replicated(lease, term, stop), 10 * TTL)
    assert terms == 2, "the replica exited instead of running its term again"


async def test_a_term_whose_nats_request_timed_out_while_the_lease_is_held_runs_again(js_bus):
    """A recorder connected to the cluster server that was killed: its next term's first request to
    NATS timed out while the connection moved to another server. The replica runs a new term."""
    kv = await ensure_lease_bucket(js_bus.js, TTL)
    lease = Lease(kv, "recorder", "replica-a", await bucket_terms(kv))
    stop = asyncio.Event()
    terms = 0

    async def term(term_stop: asyncio.Event, held: Lease) -> None:
        nonlocal terms
        terms += 1
        if terms == 1:
            assert held.held()
            raise nats.errors.TimeoutError
        stop.set()

    await asyncio.wait_for(run_replicated(lease, term, stop), 10 * TTL)
    assert terms == 2, "the replica exited on a timeout instead of running its term again"
