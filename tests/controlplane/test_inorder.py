"""Services see their messages in stream order, each once, as replay feeds them: over a real nats-server
a delivery that never arrived is fetched again at once, before newer messages."""

from __future__ import annotations

import asyncio

from controlplane.bus.inorder import in_order
from controlplane.bus.memory import MemoryBus
from controlplane.events import Event, encode
from controlplane.service import ServiceShell
from tests.deliveries import fetch_all

from .samples import sample


class Probe:
    """A core that only remembers the ids of the events it was handed, in order."""

    name = "probe"
    subjects = ("clock.tick",)

    def __init__(self) -> None:
        self.seen: list[str] = []

    def handle(self, event: Event) -> list[Event]:
        self.seen.append(event.id)
        return []


async def wait_for(cond, seconds: float) -> bool:
    for _ in range(int(seconds / 0.05)):
        if cond():
            return True
        await asyncio.sleep(0.05)
    return cond()


async def test_a_delivery_lost_in_flight_is_handled_at_once_and_in_stream_order(js_bus):
    """A server or connection that goes away with a pull reply in flight has counted those messages as
    delivered: a plain consumer hands out later ones first and the lost ones only after `ack_wait`
    (here 30 s), so the core would see another order than replay gives it. A second client on the
    service's durable consumer takes up to three messages and never acknowledges them: a lost delivery made
    on purpose, with the real server and client."""
    ids = [f"tick-{i}" for i in range(20)]
    for i in range(10):
        await js_bus.publish("clock.tick", encode(sample("clock.tick", i)), ids[i])
    probe = Probe()
    shell = ServiceShell(probe, js_bus, ack_wait=30.0)
    stop = asyncio.Event()
    task = asyncio.create_task(shell.run(stop))
    try:
        assert await wait_for(lambda: len(probe.seen) >= 10, 10)
        thief = await js_bus.js.pull_subscribe_bind(durable="svc-probe", stream=js_bus.stream)
        stolen = asyncio.create_task(thief.fetch(3, timeout=10))
        await asyncio.sleep(1.0)  # the shell's own pull request expires and queues behind the thief's
        for i in range(10, 20):
            await js_bus.publish("clock.tick", encode(sample("clock.tick", i)), ids[i])
        taken = [m.metadata.sequence.stream for m in await stolen]
        assert taken and taken == list(range(11, 11 + len(taken)))
        await wait_for(lambda: len(probe.seen) >= 20, 10)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    sent = [sample("clock.tick", i).id for i in range(20)]
    assert probe.seen == sent
    assert shell.handled == 20


async def test_messages_delivered_again_after_they_were_handed_out_are_acknowledged_and_dropped():
    now = [0.0]
    bus = MemoryBus(clock=lambda: now[0])
    for i in range(5):
        await bus.publish("clock.tick", encode(sample("clock.tick", i)), f"t{i}")
    consumer = await in_order(bus, "svc-probe", ("clock.tick",), ack_wait=10.0)
    first = await consumer.fetch(3, timeout=0.1)
    assert [d.seq for d in first] == [1, 2, 3]
    await first[0].ack()  # 2 and 3 handled, but their acknowledgements lost
    now[0] = 60.0  # past ack_wait: the bus delivers 2 and 3 again
    rest = await consumer.fetch(10, timeout=0.1)
    assert [d.seq for d in rest] == [4, 5]
    assert consumer.dropped == 2
    for d in rest:
        await d.ack()
    assert await consumer.ack_floor() == 5  # the dropped ones were acknowledged
    assert await consumer.fetch(10, timeout=0.05) == []


async def test_jetstream_numbers_every_delivery_redeliveries_too(js_bus):
    """The delivery number the lost-delivery check relies on, read from the real server's ack subject:
    it counts deliveries of this consumer, not stream sequences (other subjects in between)."""
    for i in range(3):
        await js_bus.publish("clock.tick", encode(sample("clock.tick", i)), f"t{i}")
        await js_bus.publish("node.heartbeat", encode(sample("node.heartbeat", i)), f"h{i}")
    consumer = await js_bus.consumer("svc-count", ("clock.tick",))
    first = await fetch_all(consumer, 3)
    assert [(d.seq, d.consumer_seq) for d in first] == [(1, 1), (3, 2), (5, 3)]
    await first[0].nak()
    again = await fetch_all(consumer, 1)
    assert await consumer.fetch(3, timeout=0.3) == []  # the nak gave back one delivery, no more
    assert [(d.seq, d.consumer_seq, d.deliveries) for d in again] == [(1, 4, 2)]
    await consumer.close()
