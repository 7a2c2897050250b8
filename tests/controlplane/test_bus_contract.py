"""One contract, two buses: every test runs on the in-memory bus and on a real nats-server."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.bus import MemoryBus, subject_matches
from controlplane.bus.nats import JetStreamBus
from tests.deliveries import fetch_all


@pytest.fixture(params=["memory", "nats"])
async def bus(request, tmp_path):
    if request.param == "memory":
        b = MemoryBus()
        yield b
        await b.close()
    else:
        server = request.getfixturevalue("nats_server")
        b = await JetStreamBus.connect(server.url)
        yield b
        await b.close()



async def test_publish_assigns_increasing_sequences(bus):
    acks = [await bus.publish("job.submitted", f"m{i}".encode(), f"id-{i}") for i in range(5)]
    assert [a.seq for a in acks] == sorted(a.seq for a in acks)
    assert len({a.seq for a in acks}) == 5
    assert await bus.last_seq() == acks[-1].seq


async def test_duplicate_msg_id_is_stored_once(bus):
    first = await bus.publish("job.submitted", b"a", "same-id")
    again = await bus.publish("job.submitted", b"a", "same-id")
    assert again.duplicate and again.seq == first.seq
    assert await bus.last_seq() == first.seq


async def test_publish_many_collects_acks(bus):
    acks = await bus.publish_many([("metrics.iteration", b"x%d" % i, f"pm-{i}") for i in range(300)])
    assert len(acks) == 300 and not any(a.duplicate for a in acks)
    again = await bus.publish_many([("metrics.iteration", b"x0", "pm-0")])
    assert again[0].duplicate


async def test_consumer_gets_stream_order_and_filters_subjects(bus):
    for i in range(6):
        await bus.publish("job.submitted" if i % 2 else "node.heartbeat", b"%d" % i)
    consumer = await bus.consumer("jobs-only", ["job.>"])
    got = await fetch_all(consumer, 3)
    assert [d.subject for d in got] == ["job.submitted"] * 3
    assert [d.data for d in got] == [b"1", b"3", b"5"]
    assert [d.seq for d in got] == sorted(d.seq for d in got)
    for d in got:
        await d.ack()
    assert await consumer.fetch(10, timeout=0.2) == []


async def test_durable_position_survives_reopen(bus):
    for i in range(4):
        await bus.publish("clock.tick", b"%d" % i)
    c1 = await bus.consumer("durable-a", [">"])
    first = await fetch_all(c1, 2)
    for d in first[:2]:
        await d.ack()
    await c1.close()
    await asyncio.sleep(0.1)
    c2 = await bus.consumer("durable-a", [">"])
    rest = await fetch_all(c2, 2)
    assert [d.data for d in rest] == [b"2", b"3"]


async def test_unacked_message_is_redelivered_after_ack_wait(bus):
    await bus.publish("job.completed", b"once")
    consumer = await bus.consumer("slow", [">"], ack_wait=1.0)
    first = await fetch_all(consumer, 1)
    assert first[0].deliveries == 1
    again = await fetch_all(consumer, 1, timeout=6.0)
    assert again and again[0].seq == first[0].seq and again[0].deliveries == 2
    await again[0].ack()
    assert await consumer.fetch(1, timeout=1.5) == []


async def test_nak_redelivers(bus):
    await bus.publish("job.failed", b"retry-me")
    consumer = await bus.consumer("nakker", [">"])
    (d,) = await fetch_all(consumer, 1)
    await d.nak()
    (again,) = await fetch_all(consumer, 1)
    assert again.seq == d.seq and again.deliveries == 2
    await again.ack()


async def test_ack_all_acknowledges_earlier_messages(bus):
    for i in range(10):
        await bus.publish("metrics.iteration", b"%d" % i)
    consumer = await bus.consumer("batcher", [">"], ack_all=True, ack_wait=1.0)
    got = await fetch_all(consumer, 10)
    await got[-1].ack()
    await asyncio.sleep(0.2)
    assert await consumer.ack_floor() == got[-1].seq
    assert await consumer.fetch(10, timeout=1.5) == []  # nothing comes back after ack_wait
    assert await consumer.lag() == 0


async def test_lag_counts_unacknowledged(bus):
    for i in range(5):
        await bus.publish("node.heartbeat", b"%d" % i)
    consumer = await bus.consumer("lagger", ["node.>"])
    assert await consumer.lag() == 5
    got = await fetch_all(consumer, 2)
    for d in got:
        await d.ack()
    await asyncio.sleep(0.2)
    assert await consumer.lag() == 3


async def test_read_range_without_consumer(bus):
    seqs = [(await bus.publish("job.started" if i % 3 else "clock.tick", b"%d" % i)).seq for i in range(9)]
    everything = [d async for d in bus.read([">"])]
    assert [d.seq for d in everything] == seqs
    part = [d async for d in bus.read(["job.>"], seqs[2], seqs[6])]
    assert [d.data for d in part] == [b"2", b"4", b"5"]
    assert [d async for d in bus.read([">"], seqs[-1] + 1)] == []


async def test_msg_id_and_time_are_delivered(bus):
    await bus.publish("model.updated", b"m", "the-id")
    (d,) = [x async for x in bus.read([">"])]
    assert d.msg_id == "the-id" and d.time > 1_600_000_000


def test_subject_matching():
    assert subject_matches(">", "job.submitted")
    assert subject_matches("job.>", "job.submitted")
    assert subject_matches("plan.decided.>", "plan.decided.node-1")
    assert not subject_matches("plan.decided.>", "plan.decided")
    assert subject_matches("job.*", "job.started")
    assert not subject_matches("job.*", "job.started.x")
    assert not subject_matches("node.>", "job.started")


async def test_reopened_durable_redelivers_unacked_at_once_and_in_order(bus):
    for i in range(3):
        await bus.publish("job.started", b"%d" % i)
    c1 = await bus.consumer("restartable", [">"], ack_wait=30.0)
    got = await fetch_all(c1, 3)
    await got[0].ack()  # the instance dies holding messages 2 and 3
    await asyncio.sleep(0.1)
    await bus.publish("job.started", b"3")
    c2 = await bus.consumer("restartable", [">"], ack_wait=30.0)
    again = await fetch_all(c2, 3, timeout=3.0)  # well before ack_wait
    assert [d.data for d in again] == [b"1", b"2", b"3"]


async def test_a_durable_started_over_at_a_sequence_delivers_from_there(bus):
    for i in range(10):
        await bus.publish("job.submitted", b"%d" % i, f"so-{i}")
    consumer = await bus.consumer("again", ack_all=True)
    first = await fetch_all(consumer, 10)
    assert [m.seq for m in first] == list(range(1, 11))
    await first[4].ack()  # up to 5 acknowledged; 6..10 delivered, not acknowledged
    await consumer.close()
    consumer = await bus.consumer("again", ack_all=True, start_seq=3)
    got = await fetch_all(consumer, 8)
    assert [m.seq for m in got] == list(range(3, 11))
