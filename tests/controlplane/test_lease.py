"""The lease that keeps one replica of a service active, against a real nats-server."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.lease import (BUCKET, Lease, LeaseBucketMissing, LeaseLost, LeaseTerms, bucket_terms,
                                ensure_lease_bucket, lease_bucket, run_replicated)
from controlplane.replicas import LeasedBus

TTL = 1.0


async def two_leases(js_bus, key: str = "policy") -> tuple[Lease, Lease]:
    kv = await ensure_lease_bucket(js_bus.js, TTL)
    terms = await bucket_terms(kv)
    return Lease(kv, key, "replica-a", terms), Lease(kv, key, "replica-b", terms)


def test_terms_renew_and_stop_before_the_entry_expires():
    terms = LeaseTerms.of_ttl(5.0)
    assert 0 < terms.renew_every_s < terms.deadline_s < terms.ttl_s
    with pytest.raises(ValueError):
        LeaseTerms(ttl_s=5.0, renew_every_s=1.0, deadline_s=5.0, poll_s=0.1)
    with pytest.raises(ValueError):
        LeaseTerms.of_ttl(0.0)


async def test_a_missing_bucket_is_a_clear_error_for_a_replica_that_only_uses_it(js_bus):
    with pytest.raises(LeaseBucketMissing, match=BUCKET):
        await lease_bucket(js_bus.js)
    await ensure_lease_bucket(js_bus.js, TTL)
    kv = await lease_bucket(js_bus.js)
    assert (await bucket_terms(kv)).ttl_s == TTL
    again = await ensure_lease_bucket(js_bus.js, 30.0)  # an existing bucket keeps its TTL
    assert (await bucket_terms(again)).ttl_s == TTL


async def test_one_holder_at_a_time_and_a_clean_release_hands_over_at_once(js_bus):
    a, b = await two_leases(js_bus)
    assert await a.try_acquire() and a.held()
    assert not await b.try_acquire() and not b.held()
    assert await a.holder_now() == "replica-a"
    assert await a.renew() and a.held()
    await a.release()
    assert not a.held()
    assert await b.try_acquire() and await b.holder_now() == "replica-b"


async def test_a_holder_that_stops_renewing_stops_before_a_standby_can_take_over(js_bus):
    a, b = await two_leases(js_bus)
    assert await a.try_acquire()
    # a is paused (it renews no more): b polls until the server lets the entry expire
    stop = asyncio.Event()
    assert await asyncio.wait_for(b.acquire(stop), 10 * TTL)
    assert not a.held(), "the old holder still counted the lease as held when the standby took it"
    # the old holder wakes up: its renewal names a revision that is gone, so it is refused for good
    assert not await a.renew() and not a.held()
    lost = asyncio.Event()
    await asyncio.wait_for(a.keep(lost), TTL)
    assert lost.is_set() and b.held()


async def test_a_term_is_stopped_and_fenced_when_its_lease_is_taken_over(js_bus):
    a, b = await two_leases(js_bus)
    bus = LeasedBus(js_bus, a)
    published: list[int] = []
    started = asyncio.Event()

    async def term(term_stop: asyncio.Event, lease: Lease) -> None:
        started.set()
        await bus.publish("clock.tick", b"x", "fenced-1")
        published.append(1)
        await term_stop.wait()  # set by the lease keeper once the lease is lost
        await bus.publish("clock.tick", b"x", "fenced-2")  # must not get through
        published.append(2)

    stop = asyncio.Event()
    runner = asyncio.create_task(run_replicated(a, term, stop))
    await asyncio.wait_for(started.wait(), 5)
    await a.kv.delete("policy")  # someone else removes the entry and takes the key
    assert await b.try_acquire()
    b_keeps = asyncio.create_task(b.keep(asyncio.Event()))
    await asyncio.sleep(3 * TTL)
    assert published == [1]
    assert not runner.done(), "the replica should stand by again, not stop"
    assert b.held() and await a.holder_now() == "replica-b"
    stop.set()
    await asyncio.wait_for(runner, 5)
    b_keeps.cancel()
    with pytest.raises(LeaseLost):
        await bus.publish("clock.tick", b"x", "fenced-3")


async def test_a_keeper_cancelled_as_a_renewal_comes_back_ends_and_renews_no_more(js_bus):
    """The end of a term cancels its lease keeper. A cancellation arriving as a renewal completes must end the
    keeper all the same: on Python 3.11 `asyncio.wait_for` returned the renewal instead, and the keeper went on
    renewing a lease nobody used while its replica waited on it for ever (a modeler that lost its lease under
    load never became active again)."""
    a, _ = await two_leases(js_bus)
    assert await a.try_acquire()
    real = a.kv
    renewals: list[int] = []

    class CancelledAsItReturns:
        """The real bucket; the keeper's task is cancelled in the step the server's answer to a renewal comes
        in, while the answer is awaited with `asyncio.wait_for` as nats-py awaits it."""

        def __getattr__(self, name):
            return getattr(real, name)

        async def update(self, *args, **kw):
            rev = await real.update(*args, **kw)
            renewals.append(rev)
            answer = asyncio.get_running_loop().create_future()
            answer.set_result(rev)  # the server's answer is in
            keeper.cancel()  # and the keeper is cancelled before it resumes
            return await asyncio.wait_for(answer, 5 * TTL)

    a.kv = CancelledAsItReturns()
    keeper = asyncio.create_task(a.keep(asyncio.Event()))
    done, _ = await asyncio.wait([keeper], timeout=5 * TTL)
    if keeper not in done:
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
    assert keeper in done and keeper.cancelled(), f"the keeper went on after {len(renewals)} cancelled renewals"
    assert len(renewals) == 1


async def test_a_keeper_told_the_term_is_done_stops_at_once_and_says_nothing_lost(js_bus):
    a, _ = await two_leases(js_bus)
    assert await a.try_acquire()
    lost, done = asyncio.Event(), asyncio.Event()
    keeper = asyncio.create_task(a.keep(lost, done))
    await asyncio.sleep(a.terms.renew_every_s * 2.5)  # a few renewals
    assert a.held() and not keeper.done()
    done.set()
    await asyncio.wait_for(keeper, a.terms.poll_s * 4)
    assert not lost.is_set()
