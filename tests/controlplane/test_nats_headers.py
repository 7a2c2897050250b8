"""The plain-shape header reader gives what nats-py's own parser gives, for every block."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings, strategies as st
from nats.aio.client import Client

from controlplane.bus.nats_headers import HeaderClient, plain_headers
from tests.deliveries import fetch_all


def _both(block: bytes):
    """(nats-py's reading, ours): each the headers, or the type of the error it raised."""
    async def read(client):
        try:
            return await client._process_headers(block)
        except Exception as exc:  # nats-py raises on some status blocks: ours must do the same there
            return type(exc)

    async def run():
        return await read(Client()), await read(HeaderClient())
    return asyncio.run(run())


BLOCKS = [
    b"NATS/1.0\r\nNats-Msg-Id: job-1\r\n\r\n",
    b"NATS/1.0\r\nNats-Msg-Id:job-1\r\n\r\n",  # no space after the colon
    b"NATS/1.0\r\nNats-Msg-Id: \t job-1 \t\r\n\r\n",  # whitespace around the value
    b"NATS/1.0\r\nA: 1\r\nB: two words\r\nA: 3\r\n\r\n",  # a repeated name: the last value
    b"NATS/1.0\r\nX: caf\xc3\xa9\r\n\r\n",  # UTF-8
    b"NATS/1.0\r\nX: \xff\xfe\r\n\r\n",  # not UTF-8: replaced
    b"NATS/1.0\r\nEmpty:\r\n\r\n",
    b"NATS/1.0\r\nX: a:b:c\r\n\r\n",  # colons in the value
    b"NATS/1.0 404 No Messages\r\n\r\n",  # status lines: nats-py's parser
    b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 5\r\n\r\n",
    b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 3\r\nNats-Last-Stream: 9\r\n\r\n",
    b"NATS/1.0\r\nBad Name: x\r\n\r\n",  # whitespace in a name
    b"NATS/1.0\r\nX: a\rb\r\n\r\n",  # a bare CR
    b"NATS/1.0\r\nno colon here\r\nY: 1\r\n\r\n",
    b"NATS/1.0\r\n\r\n",
    b"NATS/1.0\r\nX: 1\r\n",  # no empty line at the end
]


@pytest.mark.parametrize("block", BLOCKS)
def test_the_same_headers_as_nats_py(block):
    theirs, ours = _both(block)
    assert ours == theirs


def test_only_the_plain_shape_is_read_here():
    assert plain_headers(b"NATS/1.0\r\nNats-Msg-Id: job-1\r\n\r\n") == {"Nats-Msg-Id": "job-1"}
    assert plain_headers(bytearray(b"NATS/1.0\r\nA: 1\r\nA: 2\r\n\r\n")) == {"A": "2"}
    for block in (b"NATS/1.0 404 No Messages\r\n\r\n", b"NATS/1.0\r\nBad Name: x\r\n\r\n", b"NATS/1.0\r\n\r\n",
                  b"NATS/1.0\r\nX: a\nb\r\n\r\n", b"NATS/1.1\r\nX: 1\r\n\r\n"):
        assert plain_headers(block) is None


_NAME = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=0, max_size=8)
_VALUE = st.binary(max_size=12) | st.text(max_size=8).map(lambda s: s.encode("utf-8", "surrogatepass"))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_NAME, st.sampled_from([b":", b": ", b":\t", b""]), _VALUE), max_size=5),
       st.sampled_from([b"NATS/1.0\r\n", b"NATS/1.0 503\r\n", b"NATS/1.0"]), st.sampled_from([b"\r\n", b""]))
def test_any_block_reads_the_same(lines, head, tail):
    block = head + b"".join(n.encode() + sep + v + b"\r\n" for n, sep, v in lines) + tail
    theirs, ours = _both(block)
    assert ours == theirs


async def test_published_ids_arrive_through_a_real_server(js_bus):
    """Ids publishes carry, plain and not (spaces inside, non-ASCII), come back as they went."""
    assert isinstance(js_bus.nc, HeaderClient)
    ids = ["job-1", "id with spaces", "caf\xe9-2"]
    for i, msg_id in enumerate(ids):
        await js_bus.publish("job.submitted", f"x{i}".encode(), msg_id)
    consumer = await js_bus.consumer("hdr-test", ["job.submitted"])
    got = await fetch_all(consumer, len(ids))
    assert [(d.msg_id, d.data) for d in got] == [(m, f"x{i}".encode()) for i, m in enumerate(ids)]
    await consumer.close()
